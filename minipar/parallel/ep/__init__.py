"""Expert parallelism: a mixture of experts with its E experts split over ep ranks.
Read in this order:

    dispatcher.py  Megatron's all-to-all token dispatcher: counts, rows to the experts'
                   ranks, sorted by local expert; combine, the way back; each with its
                   backward (the all-to-all with the splits swapped)
    layer.py       ExpertParallelExperts (nn's Experts, this rank's E/ep, wrapped in
                   dispatch and combine) and ExpertParallelMoE (nn's MoE with them)

Only the expert-parallel group is known here; how the replicated router's and the
experts' gradients are reduced over data-parallel replicas is answered in parallel/mesh.
"""

from .dispatcher import (DispatchRecord, combine, combine_backward, dispatch,
                         dispatch_backward, exchange_counts, local_expert_indices,
                         num_local_experts, sort_chunks_by_idxs)
from .layer import ExpertParallelExperts, ExpertParallelMoE

__all__ = ["DispatchRecord", "dispatch", "dispatch_backward", "combine", "combine_backward",
           "exchange_counts", "local_expert_indices", "num_local_experts",
           "sort_chunks_by_idxs", "ExpertParallelExperts", "ExpertParallelMoE"]
