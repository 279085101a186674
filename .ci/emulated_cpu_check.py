"""Run with the tests by .ci/emulated-intel: that its test processes do run as the emulated
Intel CPU. A failure here says the run's other results are not the emulated CPU's."""
import os

from engine.runtime import cpu, int8_kernel


def test_torch_and_mkl_see_an_intel_avx2_cpu(capfd):
    import torch

    assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
        torch.ones(64, 64) @ torch.ones(64, 64)
    # MKL names the code path it took: an AMD CPU gets "Intel(R) Architecture processors".
    assert "Intel(R) AVX2" in capfd.readouterr().out


def test_tandem_loads_its_avx2_kernel_build():
    assert "avx512f" not in cpu.cpu_flags()
    assert "-avx2-" in int8_kernel.library_origin()


def test_llamacpp_is_the_build_for_the_emulated_cpu():
    import llama_cpp

    assert llama_cpp.__file__.startswith(os.environ["PYTHONPATH"])
