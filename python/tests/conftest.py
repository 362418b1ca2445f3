import pathlib

import pytest

import ruda

KERNELS = pathlib.Path(ruda.__file__).with_name("_test_kernels.so")
SIGNATURES = {"empty": "", "fill_f32": "PfI", "axpy": "PPfI", "inc_u32": "PI", "fail": "i",
              "dense": "PPPPII"}


@pytest.fixture
def dev():
    d = ruda.Device(backend="host", streams=4)
    d.load_host_kernels(KERNELS, SIGNATURES)
    yield d
    d.close()
