//! The receiver- and sender-sorted (CSR) views of an edge list that the
//! convolution kernels walk.

use crate::error::{check_len, E3nnError};

/// Receiver- and sender-sorted views (CSR) of an edge list over `n_rows` rows.
/// Build it once per graph and reuse it for every layer.
#[derive(Clone, Debug)]
pub struct ConvGraph {
    pub(super) n_rows: usize,
    pub(super) centers: Vec<u32>,
    pub(super) neighbors: Vec<u32>,
    pub(super) center_offsets: Vec<usize>,
    pub(super) center_edges: Vec<u32>,
    pub(super) neighbor_offsets: Vec<usize>,
    pub(super) neighbor_edges: Vec<u32>,
    /// Inverse of `neighbor_edges`: the sender-CSR position of every edge.
    pub(super) neighbor_pos: Vec<u32>,
}

fn csr(n_rows: usize, idx: &[u32]) -> (Vec<usize>, Vec<u32>) {
    let mut offsets = vec![0usize; n_rows + 1];
    for &i in idx {
        offsets[i as usize + 1] += 1;
    }
    for r in 0..n_rows {
        offsets[r + 1] += offsets[r];
    }
    let mut fill = offsets.clone();
    let mut edges = vec![0u32; idx.len()];
    for (e, &i) in idx.iter().enumerate() {
        edges[fill[i as usize]] = e as u32;
        fill[i as usize] += 1;
    }
    (offsets, edges)
}

impl ConvGraph {
    /// Indexes the edges `(centers[e] ← neighbors[e])`; both must be
    /// `< n_rows`. Rows that appear in no edge are allowed (their `A` row is 0).
    pub fn new(n_rows: usize, centers: &[u32], neighbors: &[u32]) -> Result<Self, E3nnError> {
        check_len("neighbors", centers.len(), neighbors.len())?;
        if centers.len() > u32::MAX as usize {
            return Err(E3nnError::Unsupported("more than 2^32 edges".into()));
        }
        for (what, arr) in [("centers", centers), ("neighbors", neighbors)] {
            if let Some((position, &i)) =
                arr.iter().enumerate().find(|(_, &i)| i as usize >= n_rows)
            {
                return Err(E3nnError::Index {
                    what,
                    position,
                    index: i as usize,
                    n_rows,
                });
            }
        }
        let (center_offsets, center_edges) = csr(n_rows, centers);
        let (neighbor_offsets, neighbor_edges) = csr(n_rows, neighbors);
        let mut neighbor_pos = vec![0u32; neighbor_edges.len()];
        for (pos, &e) in neighbor_edges.iter().enumerate() {
            neighbor_pos[e as usize] = pos as u32;
        }
        Ok(Self {
            n_rows,
            centers: centers.to_vec(),
            neighbors: neighbors.to_vec(),
            center_offsets,
            center_edges,
            neighbor_offsets,
            neighbor_edges,
            neighbor_pos,
        })
    }
    /// Number of rows (atoms) the indices address.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }
    /// Number of edges.
    pub fn n_edges(&self) -> usize {
        self.centers.len()
    }
    /// Receiver of every edge.
    pub fn centers(&self) -> &[u32] {
        &self.centers
    }
    /// Sender of every edge.
    pub fn neighbors(&self) -> &[u32] {
        &self.neighbors
    }
}
