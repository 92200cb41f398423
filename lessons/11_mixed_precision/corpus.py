"""Lesson 11's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
BITS = line("bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)")
LSB = line("lsb = (bits >> 16) & 1  # the last bit kept: a tie rounds to make it 0")
ROUNDED = line("rounded = bits + np.uint32(0x7FFF) + lsb  # past the halfway point, or at it "
               "when odd")
RETURN16 = line("return (rounded >> 16).astype(np.uint16)")

OVERFLOW = (line("if found_overflow:")
            + line("return False, max(scale * backoff_factor, min_scale), 0", 8))
GROW = line("if clean_steps == growth_interval:")
GROW_RETURN = line("return True, scale * growth_factor, 0", 8)

PRECISION = (line('if precision == "fp32":')
             + line("w, g, k = 4, 4, 8  # float32 weights and gradients, Adam's m and v", 8)
             + line("else:")
             + line("w, g, k = 2, (4 if fp32_grads else 2), 12  # bf16 weights; master, m, v",
                    8))
STAGE = line("stage = max(zero, 1 if distributed_optimizer else 0)")
PARAMS = line("params = w / d if stage >= 3 else w")
GRADS = line("grads = g / d if stage >= 2 else g")

PLAN = line('return {"main_grad": True, "stage": 1, "micro_batches": batch}')

WRONG = [
    # 11.1 rounding to bf16
    wrong("11.1", "misconception", "truncation: the top 16 bits kept as they are",
          old=ROUNDED, new=line("rounded = bits"),
          hint=["you truncated", "round to the nearest bf16 value, ties to even"]),
    wrong("11.1", "misconception", "round half up: ties away from zero instead of to even",
          old=ROUNDED, new=line("rounded = bits + np.uint32(0x8000)"),
          hint=["an exact tie", "ties go to the even neighbour"]),
    wrong("11.1", "small-only", "the magnitude's bits only: right while x >= 0",
          old=BITS, new=line("bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)"
                             " & np.uint32(0x7FFFFFFF)"),
          hint=["the sign bit (bit 15 of the result) is lost"]),
    wrong("11.1", "small-only", "8 significant bits by frexp: right until the subnormals",
          edits=[(BITS, line("m, e = np.frexp(np.asarray(x, dtype=np.float64))")
                  + line("r = np.ldexp(np.round(m * 256) / 256, e)  # 8 bits, ties to even")
                  + line("with np.errstate(over='ignore'):")
                  + line("bits = r.astype(np.float32).view(np.uint32)", 8)),
                 (ROUNDED, line("rounded = bits  # already rounded"))],
          hint=["a subnormal", "finer than bf16's subnormals"]),
    wrong("11.1", "misconception", "a carry that stops at the mantissa",
          edits=[(ROUNDED, line("up = ((bits & 0xFFFF) + 0x7FFF + lsb) >> 16")
                  + line("keep = (bits >> 16) & 0x7F  # the mantissa bits bf16 keeps")
                  + line("rounded = ((bits >> 16) - keep + ((keep + up) & 0x7F)) << 16"))],
          hint=["carries out of the mantissa into the exponent"]),
    # 11.2 the dynamic loss scaler
    wrong("11.2", "misconception", "doubles the scale on every clean step",
          old=GROW, new=line("if True:"),
          hint=["grows on every clean step", "growth_interval clean steps in a row"]),
    wrong("11.2", "misconception", "backs off but still takes the overflowing step",
          old=OVERFLOW, new=(line("if found_overflow:")
                             + line("return True, max(scale * backoff_factor, min_scale), 0",
                                    8)),
          hint=["an overflowing step was taken", "must be skipped"]),
    wrong("11.2", "small-only", "the clean count kept through an overflow: right while "
          "overflows never interrupt a run",
          old=OVERFLOW, new=(line("if found_overflow:")
                             + line("return False, max(scale * backoff_factor, min_scale), "
                                    "clean_steps", 8)),
          hint=["not restarted at an overflow"]),
    wrong("11.2", "small-only", "no floor: right until the scale would pass min_scale",
          old=OVERFLOW, new=(line("if found_overflow:")
                             + line("return False, scale * backoff_factor, 0", 8)),
          hint=["went below min_scale"]),
    wrong("11.2", "small-only", "factors 2 and 0.5 written in: right with the defaults",
          edits=[(OVERFLOW, line("if found_overflow:")
                  + line("return False, max(scale * 0.5, min_scale), 0", 8)),
                 (GROW_RETURN, line("return True, scale * 2.0, 0", 8))],
          hint=["you used 2 and 0.5"]),
    # 11.3 bytes a parameter
    wrong("11.3", "misconception", "ZeRO's 16: bf16 gradients whatever fp32_grads says",
          old=PRECISION, new=(line('if precision == "fp32":')
                              + line("w, g, k = 4, 4, 8", 8) + line("else:")
                              + line("w, g, k = 2, 2, 12", 8)),
          hint=["your gradients are 2 bytes a parameter", "18 bytes a parameter"]),
    wrong("11.3", "misconception", "12/d applied to the weights too",
          old=PARAMS, new=line("params = w / d if stage >= 1 else w"),
          hint=["you divided the weights by d too", "6 + 12/d"]),
    wrong("11.3", "misconception", "the distributed optimizer shards the gradients as well",
          old=GRADS, new=line("grads = g / d if stage >= 2 or distributed_optimizer else g"),
          hint=["keeps the whole float32 gradient buffer"]),
    wrong("11.3", "misconception", "the distributed optimizer left out",
          old=STAGE, new=line("stage = zero"),
          hint=["ZeRO-1 by another name"]),
    wrong("11.3", "small-only", "every run counted as bf16: right unless precision is fp32",
          old=PRECISION, new=line("w, g, k = 2, (4 if fp32_grads else 2), 12"),
          hint=["an fp32 run counted as bf16", "4 + 4 + 8"]),
    # 11.4 the plan
    wrong("11.4", "misconception", "bf16 buffers with the distributed optimizer: 16 bytes fit",
          old=PLAN, new=line('return {"main_grad": False, "stage": 1, "micro_batches": batch}'),
          hint=["over its budget of 1e-05", "main_grad=True keeps the buffers",
                "changes where the gradients live, not their precision"]),
    wrong("11.4", "misconception", "main_grad under DDP: precision first, memory ignored",
          old=PLAN, new=line('return {"main_grad": True, "stage": 0, "micro_batches": batch}'),
          hint=["the peak memory", "DDP keeps all 18 bytes a parameter",
                "Megatron's distributed optimizer"]),
    wrong("11.4", "misconception", "ZeRO-3 shards everything, so bf16 is enough",
          old=PLAN, new=line('return {"main_grad": False, "stage": 3, "micro_batches": batch}'),
          hint=["accumulated over", "in bf16 buffers", "ZeRO-3"]),
    wrong("11.4", "small-only", "the whole batch at once: right for one sequence a rank",
          old=PLAN, new=line('return {"main_grad": True, "stage": 1, "micro_batches": 1}'),
          hint=["batch=2", "the peak memory", "activations grow with the sequences"]),
]

RIGHT = [
    right("rounding with an explicit tie rule",
          edits=[(LSB, line("low, kept = bits & 0xFFFF, bits >> 16")),
                 (ROUNDED, line("up = (low > 0x8000) | ((low == 0x8000) & ((kept & 1) == 1))")),
                 (RETURN16, line("return (kept + up).astype(np.uint16)"))]),
    right("the scaler as one expression a branch",
          old=GROW + GROW_RETURN + line("return True, scale, clean_steps"),
          new=line("grow = clean_steps == growth_interval")
          + line("return True, scale * growth_factor if grow else scale, 0 if grow else "
                 "clean_steps")),
    right("bytes a parameter from the planner's own count",
          edits=[(STAGE, line("from minipar.plan import model_state_bytes")
                  + line("stage = max(zero, 1 if distributed_optimizer else 0)")
                  + line("out = model_state_bytes(1, stage, d, k=k, param_bytes=w, "
                         "grad_bytes=g)")
                  + line("return out"))]),
    right("ZeRO-3 with main_grad where n > 2",
          old=PLAN, new=line('return {"main_grad": True, "stage": 1 if n == 2 else 3, '
                             '"micro_batches": batch}')),
]
