"""The one thing pyproject.toml cannot say: the wheel's tag follows what it carries.

The wheel carries the native kernels' shared libraries where packaging/setup.sh built them
(engine/runtime/_built/, by engine/runtime/kernel_build.py, on Linux x86-64 only). setuptools
sees no extension module among them, so it would tag the wheel py3-none-any, and pip would
install x86-64 Linux libraries on an ARM Mac. With them the tag names the build machine's
platform (py3-none-linux_x86_64); the libraries are plain C loaded with ctypes and use none
of Python's C API, so no interpreter or ABI tag (cp311) is needed.

Without them (setup built none: another platform, or no compiler) the wheel stays
py3-none-any: it is pure Python, and the runtime compiles a kernel at first use where it can
or leaves the products to torch (engine/runtime/int8_kernel.py).

Nothing is compiled here: the libraries must exist before the wheel is built.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.dist import Distribution

PREBUILT_KERNELS = Path(__file__).resolve().parent / "engine" / "runtime" / "_built"


def carries_native_kernels() -> bool:
    """Whether the wheel will hold shared libraries: pyproject's package-data ships every
    engine/runtime/_built/*.so there is."""
    return any(PREBUILT_KERNELS.glob("*.so"))


class DistributionWithPrebuiltLibraries(Distribution):
    """Platform-specific where it carries the libraries. Saying so here, rather than only in the
    wheel's tag, also makes the build and the install put the packages in the platform folder
    (platlib), where a non-pure wheel's root belongs. There are no extension modules to build,
    so build_ext does nothing and needs no compiler."""

    def has_ext_modules(self) -> bool:
        return carries_native_kernels()


class PlatformOnlyWheel(bdist_wheel):
    """A platform tag without an interpreter's: setuptools would write cp311-cp311 for a
    distribution with extension modules."""

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, platform = super().get_tag()
        if self.root_is_pure:
            return python, abi, platform
        return self.python_tag, "none", platform  # e.g. py3-none-linux_x86_64


setup(distclass=DistributionWithPrebuiltLibraries, cmdclass={"bdist_wheel": PlatformOnlyWheel})
