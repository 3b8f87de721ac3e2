"""Triton kernels for the GPU path: KV write through ``slot_mapping``, sub-block KV copies, paged
attention for mixed prefill/decode batches and a split-KV decode kernel.

Kernel modules are imported on demand (``from yoco_rs.kernels.paged_attention import ...``): importing
this package does not import Triton, so CPU-only code paths never pay for it. Under
``TRITON_INTERPRET=1`` the kernels run on CPU tensors through Triton's interpreter (the CI tests).
"""
