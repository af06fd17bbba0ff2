"""`Calculator(device=...)`: the device is checked, models without a GPU
path and machines without a GPU are refused with a `ValueError` that says
which. On a GPU machine (``DDMLIP_GPU_TESTS=1``) the GPU results equal the
CPU's in float64, on one rank and on ranks sharing the GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from ase.io import read

import ddmlip
from conftest import max_rel

GPU = os.environ.get("DDMLIP_GPU_TESTS") == "1" and os.path.exists("/dev/nvidia0")


def test_device_names_are_checked():
    for bad in ["gpu", "cuda:", "cuda:x", "CPU"]:
        with pytest.raises(ValueError, match="unknown device"):
            ddmlip.Calculator("lj", device=bad)


def test_a_spec_does_not_apply_to_a_gpu():
    with pytest.raises(ValueError, match="spec does not apply"):
        ddmlip.Calculator("lj", ranks=2, spec={}, device="cuda")


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_a_model_without_gpu_kernels_asks_for_the_gpu_through_the_engine():
    # eam-demo has no CUDA kernels of its own: it runs through the op
    # engine on the GPU, so without one it says what is missing.
    with pytest.raises(ValueError) as err:
        ddmlip.Calculator("eam-demo", device="cuda")
    assert "no CUDA driver library found" in str(err.value)


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_no_gpu_says_so():
    with pytest.raises(ValueError) as err:
        ddmlip.Calculator("lj", device="cuda")
    assert "no CUDA driver library found" in str(err.value)
    assert 'device="cpu"' in str(err.value)


@pytest.mark.skipif(not GPU, reason="needs a GPU and DDMLIP_GPU_TESTS=1")
def test_gpu_equals_cpu_in_float64(sevennet_fixtures, sevennet_available):
    rng = np.random.default_rng(3)
    ar = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((4, 4, 4))
    ar.positions += rng.normal(scale=0.05, size=ar.positions.shape)
    frames = read(sevennet_fixtures, ":")
    cu = bulk("Cu", "fcc", a=3.615, cubic=True).repeat((3, 3, 3))
    cu.positions += rng.normal(scale=0.05, size=cu.positions.shape)
    # eam-demo has no CUDA kernels of its own: the op engine on the GPU.
    cases = [("lj", [ar]), ("schnet-demo", frames), ("sevennet-0", frames), ("eam-demo", [cu])]
    for model, frames in cases:
        cpu = ddmlip.Calculator(model)
        gpu = ddmlip.Calculator(model, device="cuda")
        for atoms in frames:
            a, b = atoms.copy(), atoms.copy()
            a.calc, b.calc = cpu, gpu
            e_cpu, e_gpu = a.get_potential_energy(), b.get_potential_energy()
            assert abs(e_gpu - e_cpu) <= 1e-10 * max(1.0, abs(e_cpu)), (model, e_gpu, e_cpu)
            assert max_rel(b.get_forces(), a.get_forces()) <= 1e-10, model
            if atoms.pbc.any():
                assert max_rel(b.get_stress(), a.get_stress()) <= 1e-10, model
            else:
                # No stress without a periodic direction, on either device.
                for calculated in (a, b):
                    with pytest.raises(PropertyNotImplementedError):
                        calculated.get_stress()


@pytest.mark.skipif(not GPU, reason="needs a GPU and DDMLIP_GPU_TESTS=1")
def test_ranks_sharing_a_gpu_equal_one_rank(sevennet_fixtures, sevennet_available):
    frames = read(sevennet_fixtures, ":")
    one = ddmlip.Calculator("sevennet-0", device="cuda")
    split = ddmlip.Calculator("sevennet-0", ranks=3, device="cuda")
    for atoms in frames:
        a, b = atoms.copy(), atoms.copy()
        a.calc, b.calc = one, split
        e_one, e_split = a.get_potential_energy(), b.get_potential_energy()
        assert abs(e_split - e_one) <= 1e-10 * max(1.0, abs(e_one)), (e_split, e_one)
        assert max_rel(b.get_forces(), a.get_forces()) <= 1e-10
        if atoms.pbc.any():
            assert max_rel(b.get_stress(), a.get_stress()) <= 1e-10
