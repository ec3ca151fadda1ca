"""Run under mpirun -np 4 by test_diffusers_pipeline.py; the pattern of docs/python.md
"diffusers pipelines": every rank runs the same WanPipeline script with seqpar's transformer on
comm=seqpar.MpiComm() (here cfg 2 x ulysses 2), and rank 0 writes the result.

    mpirun -np 4 python3 wan_pipeline_mpi.py PIPELINE_DIR OUT.npz
"""

import os
import sys

import numpy as np
from diffusers import WanPipeline

import seqpar
from test_diffusers_pipeline import NO_TEXT_ENCODER, generate  # the test's seeded call

path, out = sys.argv[1], sys.argv[2]
comm = seqpar.MpiComm()
transformer = seqpar.WanTransformer.from_pretrained(os.path.join(path, "transformer"), comm=comm,
                                                    cfg=2, ulysses_degree=2)
pipe = WanPipeline.from_pretrained(path, transformer=None, **NO_TEXT_ENCODER)  # and the rest
pipe.transformer = transformer
frames, latents = generate(pipe)  # every rank: the same frames
if comm.rank == 0:
    np.savez(out, frames=frames, latents=latents.numpy())
