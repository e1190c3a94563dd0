"""What the attention's kernels can do on a device: every decision the package takes on the device type.

The planner (:meth:`fairseq_pe.models.attention.PositionAttention.plan`) and the masks it builds ask an attention's
:attr:`~fairseq_pe.models.attention.PositionAttention.capabilities`, a :class:`DeviceCapabilities`, and nothing else,
whether the device is CUDA.  Each attention holds the process's :data:`DEVICE` unless an instrument injects another
object for its own block (:mod:`fairseq_pe.diagnostics.capabilities`: a count on the CPU of the operators a CUDA step
runs takes CUDA's branches through it), so no device test is patched by name and none sits on the hot path.

Every answer follows torch 2.13's kernels:

* :meth:`~DeviceCapabilities.aligned_rows`: CUDA's memory-efficient kernel reads a mask in place only where each row
  starts at a multiple of 16 elements (``preprocess_mask`` in ATen's ``attention.cu`` pads and copies it otherwise);
* :meth:`~DeviceCapabilities.mask_gradient_fused`: CUDA's memory-efficient kernel returns a float mask's gradient;
  on the CPU it needs the probabilities (the blockwise path);
* :meth:`~DeviceCapabilities.flex_backward`: FlexAttention's backward ("FlexAttention does not support backward on
  CPU");
* :meth:`~DeviceCapabilities.flex_float64`: FlexAttention in float64 (the CPU's kernel takes float32, fp16, bf16);
* :meth:`~DeviceCapabilities.relative_vectors_explicit`: the Shaw family's evaluation written out, where no SDPA
  kernel that returns the log-sum-exp is wired (:mod:`fairseq_pe.models.relative_vector_blocks` calls the CPU's).
"""

import torch

#: the names of the predicates of :class:`DeviceCapabilities`, each a function of a ``torch.device``
PREDICATES = ("aligned_rows", "mask_gradient_fused", "flex_backward", "flex_float64", "relative_vectors_explicit")


class DeviceCapabilities:
    """The device's kernels as torch 2.13 has them (module docstring); stateless, shared by every attention."""

    def aligned_rows(self, device: torch.device) -> bool:
        """Whether masks are laid out with rows aligned for CUDA's memory-efficient kernel
        (:func:`fairseq_pe.models.attention.kernel_layout`)."""
        return device.type == "cuda"

    def mask_gradient_fused(self, device: torch.device) -> bool:
        """Whether torch's fused kernels give the gradient of a float mask (T5, KERPLE and FIRE then train on SDPA)."""
        return device.type == "cuda"

    def flex_backward(self, device: torch.device) -> bool:
        """Whether FlexAttention's backward runs on ``device``."""
        return device.type == "cuda"

    def flex_float64(self, device: torch.device) -> bool:
        """Whether FlexAttention computes in float64 on ``device``."""
        return device.type == "cuda"

    def relative_vectors_explicit(self, device: torch.device) -> bool:
        """Whether the Shaw family's blocks in evaluation are computed explicitly: torch's CPU kernel
        (``_scaled_dot_product_flash_attention_for_cpu``) returns the log-sum-exp that their SDPA path needs
        (:mod:`~fairseq_pe.models.relative_vector_blocks`); CUDA's kernels are not wired to it."""
        return device.type == "cuda"


#: the capabilities every attention holds unless an instrument injects others
DEVICE = DeviceCapabilities()
