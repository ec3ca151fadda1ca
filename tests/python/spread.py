"""The references' own spread, for tests whose results pass through a rounding to 16 bits or a
long amplifying chain (bf16 activations, a 16-bit K/V cache, a guided denoising loop over sharp
attention).

seqpar sums its products in another order than PyTorch, so its float32 values differ from the
reference's by a few float32 steps. Where a rounding to bf16 or fp16 follows, such a step moves an
element across a rounding boundary now and then (one bf16 step is 2^15 float32 steps), and the
later layers carry it; a guided loop amplifies any step. How far that takes the output depends on
which element crosses, which depends on the CPU's kernels: a tolerance set from one machine's
error holds the test to one summation order. So these tests also run the reference with its inputs
nudged by one to four float32 steps (scaled by 1 + e, e in NUDGES) and hold seqpar to MARGIN times
the largest move, or to the tolerance measured where nothing crosses, whichever is larger.
Measured: on the K/V cache test's bf16 rows the nudged reference moved 5e-4 to 1.8e-2, seqpar
(AVX-512, and with SEQPAR_KERNEL_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2) 5e-4 to 1.2e-2; on the bf16
activations test's checkpoint with biases 0.065-0.10 and 0.069-0.081.
"""

NUDGES = (2.0**-23, -2.0**-23, 2.0**-22, -2.0**-22, 2.0**-21, -2.0**-21)
MARGIN = 1.5


def tolerance(floor, spread):
    """The bound a test holds seqpar to: floor (measured where no element crosses a boundary), or
    MARGIN times the reference's own spread."""
    return max(floor, MARGIN * spread)
