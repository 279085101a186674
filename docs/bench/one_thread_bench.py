"""`tandem bench` on one core (python docs/bench/one_thread_bench.py bench ...): llama.cpp and torch each on one thread, so that another process
on the second core does not stall llama.cpp's thread barrier."""
import sys

import torch

import engine.runtime.llamacpp as llamacpp

llamacpp._physical_cores = lambda: 1
torch.set_num_threads(1)
from engine.cli import main

sys.exit(main(sys.argv[1:]))
