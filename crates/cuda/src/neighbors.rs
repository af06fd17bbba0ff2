//! The neighbour list on the GPU: a cell list over the same periodic frame
//! as `ddmlip-neighbors` (triclinic cells, mixed periodicity, cells smaller
//! than the cutoff), giving the full list as CSR by centre with the CPU
//! list's pairs, shifts and order.
//!
//! Steps, all on the device's stream: bin atoms (wrap counts along periodic
//! axes), prefix-sum the bin counts, fill and sort the bins, count each
//! centre's neighbours, prefix-sum them into row offsets, fill and sort each
//! row by `(j, S)`. The host reads one number (the pair count, to size the
//! pair arrays); the list itself never leaves the device unless asked
//! ([`GpuNeighborList::to_host`]).

use crate::{CudaDevice, CudaError};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use ddmlip_atoms::System;
use ddmlip_neighbors::{Frame, MAX_CELLS_AWAY};
use std::time::Instant;

/// Candidates are searched within `cutoff · (1 + SEARCH_MARGIN)`: the bins
/// only propose pairs; the exact CPU distance test decides.
const SEARCH_MARGIN: f64 = 1e-6;

/// A stencil visiting more (bin, image) cells than this per atom is refused
/// (a cell far too small or skewed for the cutoff).
const MAX_STENCIL_CELLS: u64 = 1_000_000;

/// Device bytes per pair of the list: `u32` neighbour and `[i32; 3]` shift.
pub const BYTES_PER_PAIR: u64 = 16;

/// Search geometry, laid out as `struct Geometry` in the kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    basis: [f64; 9],
    inverse: [f64; 9],
    lo: [f64; 3],
    width: [f64; 3],
    cutoff2: f64,
    pbc: [i32; 3],
    nbins: [i32; 3],
    reach: [i32; 3],
    n_atoms: u32,
}

// SAFETY: plain `repr(C)` data matching the kernels' struct.
unsafe impl DeviceRepr for Geometry {}

/// Wall-clock seconds of the phases of a GPU evaluation (the stream is
/// synchronised at each phase end).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuTimings {
    /// Upload of the positions and the neighbour-list build.
    pub neighbors_s: f64,
    /// The model's kernels, reductions and the download of the results.
    pub model_s: f64,
}

/// A full neighbour list on the device, CSR by centre: row `i` holds pairs
/// `row_start[i]..row_start[i + 1]`, sorted by neighbour `j` then shift `S`
/// (lexicographic), exactly the pairs `(i, j, S)` of
/// `ddmlip_neighbors::neighbor_list` with `half = false`.
pub struct GpuNeighborList {
    /// Number of atoms (rows).
    pub n_atoms: usize,
    /// Number of pairs.
    pub n_pairs: usize,
    /// The frame the shifts refer to (the cell on periodic axes).
    pub frame: Frame,
    /// Positions (Å), `3·n_atoms` row-major, as given (not wrapped).
    pub(crate) positions: CudaSlice<f64>,
    /// `n_atoms + 1` row offsets.
    pub(crate) row_start: CudaSlice<u64>,
    /// Neighbour `j` of each pair.
    pub(crate) neighbors: CudaSlice<u32>,
    /// Shift `S` of each pair, `3·n_pairs`.
    pub(crate) shifts: CudaSlice<i32>,
}

impl std::fmt::Debug for GpuNeighborList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuNeighborList")
            .field("n_atoms", &self.n_atoms)
            .field("n_pairs", &self.n_pairs)
            .finish()
    }
}

fn launch_1d(n: u64) -> LaunchConfig {
    const THREADS: u32 = 128;
    LaunchConfig {
        grid_dim: (n.div_ceil(u64::from(THREADS)).max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn scan_config() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The binning of one axis: (number of bins, fractional origin, fractional
/// width, stencil reach in bins), with at most `max_bins` bins.
fn axis_grid(
    periodic: bool,
    height: f64,
    range: (f64, f64),
    search: f64,
    max_bins: f64,
) -> AxisGrid {
    if periodic {
        let n = (height / search).floor().clamp(1.0, max_bins);
        let width = 1.0 / n;
        let reach = (search / (width * height)).ceil();
        (n as i32, 0.0, width, reach as i32)
    } else {
        // Open rows of the frame are unit vectors: fractional extent is Å.
        let extent = range.1 - range.0;
        let n = (extent / search).floor().clamp(1.0, max_bins);
        let width = if extent > 0.0 { extent / n } else { 1.0 };
        let reach = (search / (width * height)).ceil().min(n - 1.0).max(0.0);
        (n as i32, range.0, width, reach as i32)
    }
}

/// (number of bins, fractional origin, fractional width, reach in bins).
type AxisGrid = (i32, f64, f64, i32);

/// Bins per axis of at least the search radius, at most 4096 per axis and
/// 8 per atom in total (a sparse system in a huge box would otherwise get
/// billions of empty bins): the axis with the most bins is halved until the
/// total fits.
fn plan_bins(frame: &Frame, range: &[(f64, f64); 3], search: f64, n_atoms: usize) -> [AxisGrid; 3] {
    let cap = (8 * n_atoms as u64).clamp(64, 1 << 31) as f64;
    let mut limits = [4096.0f64; 3];
    loop {
        let grid: [AxisGrid; 3] = std::array::from_fn(|k| {
            axis_grid(frame.pbc[k], frame.heights[k], range[k], search, limits[k])
        });
        let total: f64 = grid.iter().map(|g| f64::from(g.0)).product();
        if total <= cap {
            return grid;
        }
        let widest = (0..3).max_by_key(|&k| grid[k].0).unwrap_or(0);
        limits[widest] = f64::from((grid[widest].0 / 2).max(1));
    }
}

impl GpuNeighborList {
    /// Builds the full list of `system` for `cutoff` (Å) on `device`.
    ///
    /// Errors: the CPU list's input errors (non-finite positions, bad cell,
    /// atoms absurdly far outside it), an empty system, a stencil too large
    /// for the cell, and [`CudaError::OutOfMemory`] naming how many atoms
    /// would fit.
    pub fn build(device: &CudaDevice, system: &System, cutoff: f64) -> Result<Self, CudaError> {
        let n = system.positions.len();
        if n == 0 {
            return Err(CudaError::Input("the system has no atoms".into()));
        }
        if n >= u32::MAX as usize {
            return Err(ddmlip_neighbors::NeighborError::TooManyAtoms(n).into());
        }
        if !(cutoff.is_finite() && cutoff > 0.0) {
            return Err(ddmlip_neighbors::NeighborError::InvalidCutoff(cutoff).into());
        }
        let frame = Frame::new(system.cell.as_ref(), system.pbc)?;
        let mut range = [(f64::INFINITY, f64::NEG_INFINITY); 3];
        for (atom, &p) in system.positions.iter().enumerate() {
            if !p.iter().all(|x| x.is_finite()) {
                return Err(ddmlip_neighbors::NeighborError::NonFinitePosition {
                    atom,
                    position: p,
                }
                .into());
            }
            let f = frame.fractional(p);
            for axis in 0..3 {
                if frame.pbc[axis] && f[axis].abs() > MAX_CELLS_AWAY {
                    return Err(ddmlip_neighbors::NeighborError::PositionTooFar {
                        atom,
                        axis,
                        cells: f[axis].abs(),
                    }
                    .into());
                }
                range[axis] = (range[axis].0.min(f[axis]), range[axis].1.max(f[axis]));
            }
        }
        let search = cutoff * (1.0 + SEARCH_MARGIN);
        let mut geometry = Geometry {
            basis: [0.0; 9],
            inverse: [0.0; 9],
            lo: [0.0; 3],
            width: [0.0; 3],
            cutoff2: cutoff * cutoff,
            pbc: [0; 3],
            nbins: [1; 3],
            reach: [0; 3],
            n_atoms: n as u32,
        };
        let mut stencil = 1u64;
        let mut n_bins = 1u64;
        let grid = plan_bins(&frame, &range, search, n);
        for (k, &(nb, lo, width, reach)) in grid.iter().enumerate() {
            geometry.basis[3 * k..3 * k + 3].copy_from_slice(&frame.basis[k]);
            geometry.inverse[3 * k..3 * k + 3].copy_from_slice(&frame.inverse[k]);
            geometry.pbc[k] = i32::from(frame.pbc[k]);
            geometry.nbins[k] = nb;
            geometry.lo[k] = lo;
            geometry.width[k] = width;
            geometry.reach[k] = reach;
            stencil = stencil.saturating_mul(2 * reach as u64 + 1);
            n_bins *= nb as u64;
        }
        if stencil > MAX_STENCIL_CELLS {
            return Err(CudaError::Input(format!(
                "cutoff {cutoff} Å against cell heights {:?} Å would make the GPU search visit \
                 {stencil} cells per atom; the cell is too small or skewed: replicate it or \
                 reduce it (e.g. ase.build.niggli_reduce)",
                frame.heights
            )));
        }
        let per_atom = 24 + 12 + 4 + 4 + 4 + 8 + 4;
        device.check_fits(
            "the neighbour-list bins",
            n as u64 * per_atom + n_bins * (4 + 8 + 4),
            n as u64,
        )?;

        let stream = device.stream();
        let dev = |what: &'static str| move |e| CudaError::driver(what, e);
        let flat: Vec<f64> = system.positions.iter().flatten().copied().collect();
        let positions = stream
            .clone_htod(&flat)
            .map_err(dev("uploading positions"))?;
        let mut wrap = stream
            .alloc_zeros::<i32>(3 * n)
            .map_err(dev("allocating wrap counts"))?;
        let mut atom_bin = stream
            .alloc_zeros::<u32>(n)
            .map_err(dev("allocating atom bins"))?;
        let nb = n_bins as usize;
        let mut bin_count = stream
            .alloc_zeros::<u32>(nb)
            .map_err(dev("allocating bins"))?;
        let mut bin_start = stream
            .alloc_zeros::<u64>(nb + 1)
            .map_err(dev("allocating bins"))?;
        let mut cursor = stream
            .alloc_zeros::<u32>(nb)
            .map_err(dev("allocating bins"))?;
        let mut bin_atoms = stream
            .alloc_zeros::<u32>(n)
            .map_err(dev("allocating bins"))?;
        let mut counts = stream
            .alloc_zeros::<u32>(n)
            .map_err(dev("allocating row counts"))?;
        let mut row_start = stream
            .alloc_zeros::<u64>(n + 1)
            .map_err(dev("allocating row offsets"))?;
        let (n32, nb32) = (n as u32, nb as u32);

        let f = device.function("nl_bin_atoms")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&positions)
            .arg(&geometry)
            .arg(&mut wrap)
            .arg(&mut atom_bin)
            .arg(&mut bin_count);
        // SAFETY: argument types and lengths match the kernel's signature.
        unsafe { b.launch(launch_1d(n as u64)) }.map_err(dev("nl_bin_atoms"))?;

        let f = device.function("scan_counts")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&bin_count).arg(&mut bin_start).arg(&nb32);
        unsafe { b.launch(scan_config()) }.map_err(dev("scan of bin counts"))?;

        let f = device.function("nl_fill_bins")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&atom_bin)
            .arg(&bin_start)
            .arg(&mut cursor)
            .arg(&mut bin_atoms)
            .arg(&n32);
        unsafe { b.launch(launch_1d(n as u64)) }.map_err(dev("nl_fill_bins"))?;

        let f = device.function("nl_sort_bins")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&bin_start).arg(&mut bin_atoms).arg(&nb32);
        unsafe { b.launch(launch_1d(n_bins)) }.map_err(dev("nl_sort_bins"))?;

        let f = device.function("nl_count")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&positions)
            .arg(&geometry)
            .arg(&wrap)
            .arg(&atom_bin)
            .arg(&bin_start)
            .arg(&bin_atoms)
            .arg(&mut counts);
        unsafe { b.launch(launch_1d(n as u64)) }.map_err(dev("nl_count"))?;

        let f = device.function("scan_counts")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&counts).arg(&mut row_start).arg(&n32);
        unsafe { b.launch(scan_config()) }.map_err(dev("scan of row counts"))?;

        // The one number the host needs: how many pairs to allocate.
        let total = stream
            .clone_dtoh(&row_start.slice(n..n + 1))
            .map_err(dev("reading the pair count"))?;
        let n_pairs = total.first().copied().unwrap_or(0) as usize;
        device.check_fits(
            "the neighbour list",
            n_pairs as u64 * BYTES_PER_PAIR,
            n as u64,
        )?;
        let mut neighbors = stream
            .alloc_zeros::<u32>(n_pairs.max(1))
            .map_err(dev("allocating pairs"))?;
        let mut shifts = stream
            .alloc_zeros::<i32>(3 * n_pairs.max(1))
            .map_err(dev("allocating pairs"))?;
        let f = device.function("nl_fill")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&positions)
            .arg(&geometry)
            .arg(&wrap)
            .arg(&atom_bin)
            .arg(&bin_start)
            .arg(&bin_atoms)
            .arg(&row_start)
            .arg(&mut neighbors)
            .arg(&mut shifts);
        unsafe { b.launch(launch_1d(n as u64)) }.map_err(dev("nl_fill"))?;
        Ok(Self {
            n_atoms: n,
            n_pairs,
            frame,
            positions,
            row_start,
            neighbors,
            shifts,
        })
    }

    /// Keeps the rows of the first `n_centers` atoms and empties the others
    /// (their pairs stay in memory, past `n_pairs`, unread): a rank needs
    /// the pairs of its owned atoms only, its ghosts being neighbours.
    /// Returns the new row offsets, as on the device.
    pub fn keep_first_centers(
        &mut self,
        device: &CudaDevice,
        n_centers: usize,
    ) -> Result<Vec<u64>, CudaError> {
        let stream = device.stream();
        let mut rows = stream
            .clone_dtoh(&self.row_start)
            .map_err(|e| CudaError::driver("downloading the row offsets", e))?;
        let end = *rows.get(n_centers).ok_or_else(|| {
            CudaError::Input(format!(
                "{n_centers} centres asked of a list of {} atoms",
                self.n_atoms
            ))
        })?;
        for r in &mut rows[n_centers..] {
            *r = end;
        }
        stream
            .memcpy_htod(&rows, &mut self.row_start)
            .map_err(|e| CudaError::driver("uploading the row offsets", e))?;
        self.n_pairs = end as usize;
        Ok(rows)
    }

    /// Builds the list and waits for it: (list, seconds).
    pub fn build_timed(
        device: &CudaDevice,
        system: &System,
        cutoff: f64,
    ) -> Result<(Self, f64), CudaError> {
        Self::build_for_centers(device, system, cutoff, None)
    }

    /// Builds the list, keeps only the rows of the first `n_centers` atoms
    /// when given (a rank's owned atoms: its ghosts are neighbours only, see
    /// [`Self::keep_first_centers`]) and waits for it: (list, seconds).
    pub fn build_for_centers(
        device: &CudaDevice,
        system: &System,
        cutoff: f64,
        n_centers: Option<usize>,
    ) -> Result<(Self, f64), CudaError> {
        let start = Instant::now();
        let mut list = Self::build(device, system, cutoff)?;
        if let Some(n) = n_centers {
            list.keep_first_centers(device, n)?;
        }
        device.synchronize()?;
        Ok((list, start.elapsed().as_secs_f64()))
    }

    /// Copies the list to the host as `(i, j, S)` triples in CSR order
    /// (for tests and inspection; evaluation never needs this).
    pub fn to_host(&self, device: &CudaDevice) -> Result<Vec<(u32, u32, [i32; 3])>, CudaError> {
        let stream = device.stream();
        let dev = |what: &'static str| move |e| CudaError::driver(what, e);
        let rows = stream
            .clone_dtoh(&self.row_start)
            .map_err(dev("downloading rows"))?;
        let nbr = stream
            .clone_dtoh(&self.neighbors)
            .map_err(dev("downloading pairs"))?;
        let sh = stream
            .clone_dtoh(&self.shifts)
            .map_err(dev("downloading shifts"))?;
        let mut out = Vec::with_capacity(self.n_pairs);
        for i in 0..self.n_atoms {
            for p in rows[i] as usize..rows[i + 1] as usize {
                out.push((i as u32, nbr[p], [sh[3 * p], sh[3 * p + 1], sh[3 * p + 2]]));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{axis_grid, plan_bins};
    use ddmlip_atoms::Cell;
    use ddmlip_neighbors::Frame;

    /// The stencil must cover every bin a neighbour can be in: a pair closer
    /// than `search` differs by less than `search / height` in fractional
    /// coordinate, which `reach` bins of `width` must span.
    #[test]
    fn the_stencil_reaches_every_neighbour_bin() {
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..10_000 {
            let search = 0.5 + 10.0 * next();
            let height = 0.3 + 60.0 * next();
            let (n, lo, width, reach) = axis_grid(true, height, (0.0, 1.0), search, 4096.0);
            assert!(n >= 1 && lo == 0.0 && (width * n as f64 - 1.0).abs() < 1e-12);
            assert!(reach as f64 * width * height >= search, "{height} {search}");
            // Open axis: the atoms span [a, b] Å (unit basis row, height 1).
            let (a, extent) = (-50.0 + 100.0 * next(), 80.0 * next());
            let (n, lo, width, reach) = axis_grid(false, 1.0, (a, a + extent), search, 4096.0);
            assert!(n >= 1 && lo == a && width > 0.0);
            assert!(width * n as f64 >= extent - 1e-9);
            // Either the stencil spans the search radius or it spans the grid.
            assert!(
                reach as f64 * width >= search || reach == n - 1,
                "{extent} {search}"
            );
        }
    }

    #[test]
    fn a_sparse_system_in_a_huge_box_gets_few_bins_that_still_cover_the_cutoff() {
        let cell = Cell::new([[5.0e4, 0.0, 0.0], [0.0, 4.0e4, 0.0], [1.0e3, 0.0, 3.0e4]]);
        for pbc in [[true; 3], [true, false, true], [false; 3]] {
            let frame = Frame::new(Some(&cell), pbc).unwrap();
            let range = [(-2.0e4, 3.0e4), (0.0, 4.0e4), (-10.0, 3.0e4)];
            let search = 5.0;
            let grid = plan_bins(&frame, &range, search, 10);
            let total: i64 = grid.iter().map(|g| i64::from(g.0)).product();
            assert!((1..=80).contains(&total), "{pbc:?}: {total} bins");
            for (k, &(n, _, width, reach)) in grid.iter().enumerate() {
                let span = f64::from(reach) * width * frame.heights[k];
                assert!(span >= search || reach == n - 1, "{pbc:?} axis {k}");
            }
        }
    }
}
