# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Lesson 06 — Zero-bubble pipelines and DualPipe
#
# Split each backward into I (the input's gradient) and W (the weights'), let W wait, and fill 1F1B's bubble: ZB-H1, ZB-H2, ZB-V and DualPipeV on one clock, against their activation memory, and why DeepSeek-V3 trained with DualPipe.

# %%
print("draft")

# %% [markdown]
# ## Exercises
#
# ## Summary
