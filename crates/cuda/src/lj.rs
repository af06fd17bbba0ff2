//! The Lennard-Jones pair potential on the GPU: energy, per-atom energies,
//! forces and stress, in f64 or f32, deterministic.
//!
//! One thread per centre sums its CSR row: atomic energy `½Σe(r)`, force
//! `Σ e'(r)/r · v` and virial `½Σ e'(r)/r · v⊗v` (the full list holds each
//! pair twice, so no scatter is needed); the energy and stress are
//! fixed-order block reductions of those rows, accumulated in f64.

use crate::model::stress_volume;
use crate::neighbors::GpuTimings;
use crate::{CudaDevice, CudaError, GpuNeighborList, GpuOutput};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use ddmlip_atoms::System;
use std::time::Instant;

/// Lennard-Jones parameters: pair energy `4ε[(σ/r)¹² − (σ/r)⁶]` for
/// `r < cutoff`, minus its value at the cutoff when `shift`; each pair's
/// energy is split half-and-half between its atoms (the `lj` model of
/// `ddmlip-models`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LjParameters {
    /// Well depth ε (eV), positive and finite.
    pub epsilon: f64,
    /// Zero-crossing distance σ (Å), positive and finite.
    pub sigma: f64,
    /// Cutoff (Å), positive and finite.
    pub cutoff: f64,
    /// Shift the pair energy to zero at the cutoff.
    pub shift: bool,
}

impl LjParameters {
    fn energy_shift(&self) -> f64 {
        if !self.shift {
            return 0.0;
        }
        let s6 = (self.sigma / self.cutoff).powi(6);
        4.0 * self.epsilon * (s6 * s6 - s6)
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct LjKernelParams {
    four_epsilon: f64,
    sigma: f64,
    energy_shift: f64,
}

// SAFETY: plain `repr(C)` data matching `struct LjParams` in the kernels.
unsafe impl DeviceRepr for LjKernelParams {}

/// Floating-point precision of a GPU evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Double precision: equal to the CPU f64 run to ~1e-13 relative.
    F64,
    /// Single precision for the pair terms and per-atom sums (positions and
    /// shifts rounded to f32); totals accumulated in f64.
    F32,
}

/// Evaluates Lennard-Jones on `system` on `device`: neighbour list and
/// model on the GPU, results copied back once.
pub fn evaluate_lj(
    device: &CudaDevice,
    system: &System,
    params: &LjParameters,
    precision: Precision,
) -> Result<GpuOutput, CudaError> {
    evaluate_lj_rows(device, system, params, precision, None)
}

/// One rank's part of a decomposed Lennard-Jones evaluation: `local` holds
/// the rank's `n_owned` owned atoms first, then its ghosts (images within
/// the cutoff of its domain, at their image positions; no cell). A pair
/// potential needs no exchange: an owned atom's row of the full list sees
/// every neighbour. Returns the energy and virial summed over the owned
/// atoms (to be summed over ranks), their per-atom energies and forces
/// (complete), no stress.
pub fn evaluate_lj_rank(
    device: &CudaDevice,
    local: &System,
    params: &LjParameters,
    precision: Precision,
    n_owned: usize,
) -> Result<GpuOutput, CudaError> {
    if n_owned > local.len() {
        return Err(CudaError::Input(format!(
            "a rank owns {n_owned} atoms but holds only {}",
            local.len()
        )));
    }
    evaluate_lj_rows(device, local, params, precision, Some(n_owned))
}

fn evaluate_lj_rows(
    device: &CudaDevice,
    system: &System,
    params: &LjParameters,
    precision: Precision,
    n_owned: Option<usize>,
) -> Result<GpuOutput, CudaError> {
    for (name, v) in [
        ("epsilon", params.epsilon),
        ("sigma", params.sigma),
        ("cutoff", params.cutoff),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(CudaError::Input(format!(
                "Lennard-Jones `{name}` must be a positive finite number, got {v}"
            )));
        }
    }
    // A rank's ghosts are neighbours only: their own rows would be discarded.
    let (list, neighbors_s) =
        GpuNeighborList::build_for_centers(device, system, params.cutoff, n_owned)?;
    let start = Instant::now();
    let n = list.n_atoms;
    let bytes = match precision {
        Precision::F64 => 8,
        Precision::F32 => 4,
    };
    device.check_fits(
        "the Lennard-Jones outputs",
        n as u64 * (1 + 3 + 6 + 3) * bytes,
        n as u64,
    )?;
    let kp = LjKernelParams {
        four_epsilon: 4.0 * params.epsilon,
        sigma: params.sigma,
        energy_shift: params.energy_shift(),
    };
    let basis: Vec<f64> = list.frame.basis.iter().flatten().copied().collect();
    let owned = n_owned.unwrap_or(n);
    let (mut atomic, mut forces, sums) = match precision {
        Precision::F64 => run::<f64>(
            device,
            &list,
            &basis,
            kp,
            ["lj_f64", "column_sums_f64"],
            owned,
        )?,
        Precision::F32 => {
            let basis32: Vec<f32> = basis.iter().map(|&x| x as f32).collect();
            run::<f32>(
                device,
                &list,
                &basis32,
                kp,
                ["lj_f32", "column_sums_f32"],
                owned,
            )?
        }
    };
    atomic.truncate(owned);
    forces.truncate(owned);
    let model_s = start.elapsed().as_secs_f64();
    let mut virial = [0.0; 6];
    virial.copy_from_slice(&sums[1..7]);
    let stress = stress_volume(system)
        .filter(|_| n_owned.is_none())
        .map(|v| virial.map(|w| w / v));
    Ok(GpuOutput {
        energy: sums[0],
        atomic_energies: atomic,
        forces,
        stress,
        virial,
        n_pairs: list.n_pairs,
        timings: GpuTimings {
            neighbors_s,
            model_s,
        },
        peak_bytes: None,
        estimated_bytes: None,
    })
}

/// Atomic energies and forces as f64 on the host, and the 7 totals
/// (energy, then the virial in Voigt order).
type Outputs = (Vec<f64>, Vec<[f64; 3]>, Vec<f64>);

fn run<T>(
    device: &CudaDevice,
    list: &GpuNeighborList,
    basis: &[T],
    kp: LjKernelParams,
    [kernel, sums_kernel]: [&str; 2],
    n_owned: usize,
) -> Result<Outputs, CudaError>
where
    T: DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Into<f64> + 'static,
{
    // f32 kernels read f32 positions, converted on the device.
    let convert = std::any::TypeId::of::<T>() != std::any::TypeId::of::<f64>();
    let stream = device.stream();
    let dev = |what: &'static str| move |e| CudaError::driver(what, e);
    let n = list.n_atoms;
    let threads = 128u32;
    let per_atom = LaunchConfig {
        grid_dim: ((n as u32).div_ceil(threads), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let basis_d = stream
        .clone_htod(basis)
        .map_err(dev("uploading the cell"))?;
    let mut converted: Option<CudaSlice<T>> = None;
    if convert {
        let mut pos = stream
            .alloc_zeros::<T>(3 * n)
            .map_err(dev("allocating f32 positions"))?;
        let f = device.function("f64_to_f32")?;
        let len = 3 * n as u64;
        let mut b = stream.launch_builder(&f);
        b.arg(&list.positions).arg(&mut pos).arg(&len);
        let cfg = LaunchConfig {
            grid_dim: ((len as u32).div_ceil(threads), 1, 1),
            ..per_atom
        };
        // SAFETY: in: 3n f64, out: 3n f32, as the kernel expects.
        unsafe { b.launch(cfg) }.map_err(dev("f64_to_f32"))?;
        converted = Some(pos);
    }
    let mut per_row = stream
        .alloc_zeros::<T>(7 * n)
        .map_err(dev("allocating outputs"))?;
    let mut forces = stream
        .alloc_zeros::<T>(3 * n)
        .map_err(dev("allocating forces"))?;
    let n32 = n as u32;
    let f = device.function(kernel)?;
    {
        // Atomic energies in rows 0..n, virials in 6n after them.
        let (mut atomic, mut virial) = per_row.split_at_mut(n);
        let mut b = stream.launch_builder(&f);
        match &converted {
            Some(pos) => b.arg(pos),
            None => b.arg(&list.positions),
        };
        b.arg(&basis_d)
            .arg(&list.row_start)
            .arg(&list.neighbors)
            .arg(&list.shifts)
            .arg(&kp)
            .arg(&n32)
            .arg(&mut atomic)
            .arg(&mut forces)
            .arg(&mut virial);
        // SAFETY: argument types and lengths match the kernel.
        unsafe { b.launch(per_atom) }.map_err(dev("the Lennard-Jones kernel"))?;
    }
    let mut sums = stream
        .alloc_zeros::<f64>(7)
        .map_err(dev("allocating totals"))?;
    let f = device.function(sums_kernel)?;
    let reduce = |data: cudarc::driver::CudaView<'_, T>,
                  rows: u32,
                  cols: u32,
                  out: &mut cudarc::driver::CudaViewMut<'_, f64>|
     -> Result<(), CudaError> {
        let mut b = stream.launch_builder(&f);
        b.arg(&data).arg(&rows).arg(&cols).arg(out);
        let cfg = LaunchConfig {
            grid_dim: (cols, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `data` holds rows·cols values, `out` cols.
        unsafe { b.launch(cfg) }.map_err(dev("the fixed-order reduction"))?;
        Ok(())
    };
    {
        // Only the first `n_owned` rows count (all of them outside a
        // decomposition).
        let (mut e_out, mut w_out) = sums.split_at_mut(1);
        let owned32 = n_owned as u32;
        reduce(per_row.slice(0..n_owned), owned32, 1, &mut e_out)?;
        reduce(per_row.slice(n..n + 6 * n_owned), owned32, 6, &mut w_out)?;
    }
    let rows = stream
        .clone_dtoh(&per_row)
        .map_err(dev("downloading energies"))?;
    let f_host = stream
        .clone_dtoh(&forces)
        .map_err(dev("downloading forces"))?;
    let totals = stream
        .clone_dtoh(&sums)
        .map_err(dev("downloading totals"))?;
    let atomic = rows[..n].iter().map(|&x| x.into()).collect();
    let forces = f_host
        .chunks_exact(3)
        .map(|c| [c[0].into(), c[1].into(), c[2].into()])
        .collect();
    Ok((atomic, forces, totals))
}
