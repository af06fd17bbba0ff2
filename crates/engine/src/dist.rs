use crate::EngineError;
use ddmlip_spec::MLIPSpec;

/// A mutable slice of either element type, for communication.
pub enum DataMut<'a> {
    /// Elements of an f64 graph.
    F64(&'a mut [f64]),
    /// Elements of an f32 graph.
    F32(&'a mut [f32]),
}

/// The decomposition runtime as seen by the engine: the rank's halo plan and
/// communicator plus the spec that selects each op's distributed meaning.
///
/// Every Atom-domain tensor on a rank has `n_local()` rows: `n_owned()` owned
/// rows first, then ghost rows. All methods are collective: every rank calls
/// them in the same order.
pub trait Distributor: Send {
    /// This rank's index, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks taking part (1 for a single process).
    fn world_size(&self) -> usize;
    /// Owned atom rows (the first rows of every Atom tensor).
    fn n_owned(&self) -> usize;
    /// Owned + ghost rows.
    fn n_local(&self) -> usize;
    /// The spec this run follows.
    fn spec(&self) -> &MLIPSpec;
    /// Owned rows that peers hold ghost copies of, ascending and distinct:
    /// the only owned rows a [`Distributor::refresh`] reads or a
    /// [`Distributor::reverse_sum`] changes. Default: every owned row.
    fn sent_rows(&self) -> Vec<u32> {
        (0..self.n_owned() as u32).collect()
    }
    /// Overwrites every ghost row with its owner's row (`rows = n_local`, row width `cols`).
    fn refresh(&mut self, data: DataMut<'_>, cols: usize) -> Result<(), EngineError>;
    /// Adds every ghost row into its owner's row, then zeroes the ghost rows.
    fn reverse_sum(&mut self, data: DataMut<'_>, cols: usize) -> Result<(), EngineError>;
    /// Element-wise sum over ranks; the result is bitwise identical on every rank.
    fn all_reduce_sum(&mut self, data: DataMut<'_>) -> Result<(), EngineError>;
    /// Marks this rank failed so that no peer waits for it.
    fn abort(&mut self, message: &str);
    /// Seconds spent in communication so far (waiting for peers included);
    /// 0 when the runtime does not measure it.
    fn comm_seconds(&self) -> f64 {
        0.0
    }
    /// Gives the runtime back its concrete type after the graph is done.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}
