// SchNet (the `schnet-demo` model) on the GPU: edge geometry and radial
// functions, shifted softplus, the continuous-filter message and its two
// backward halves, the readout seed and species offsets. The GEMMs run in
// cuBLAS; species embedding, biases, the sender CSR, forces and virials reuse
// the SevenNet module's kernels. Compiled by NVRTC with --fmad=false; every
// template is instantiated for double (suffix _f64) and float (suffix _f32).
//
// Determinism: no floating-point atomics. Every output element has one
// writer; sums over edges run over CSR rows in row order, sums over feature
// columns by a fixed warp tree.
//
// Layouts (row-major): node rows N x f; edges in the receiver-CSR order of
// the neighbour list (edge e = CSR position), edge rows E x f or E x k.

// u32, u64 and edge_vector come from edges.cuh, prepended at compile time.

#define SC_MAX_RBF 32
#define SC_PI 3.14159265358979323846

struct SchNetEdgeParams {
    double centers[SC_MAX_RBF];
    u32 n_rbf;
    u32 _pad;
    double gamma;
    double cutoff;
};

// Per receiver row i, per edge e of it: the receiver, the vector
// r_j + shift - r_i (f64), the k Gaussians exp(-gamma (r - mu)^2) and the
// cosine cutoff 0.5 (cos(pi r / rc) + 1) (zero from rc on), computed in f64
// and rounded once to T.
template <typename T>
__device__ void edges(const double* pos, const double* basis, const u64* row_start, const u32* nbr,
                      const int* shifts, SchNetEdgeParams g, u32 n_atoms, u32* centers, double* vectors,
                      T* rbf, T* fc) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_atoms) return;
    for (u64 e = row_start[i]; e < row_start[i + 1]; ++e) {
        double v[3];
        edge_vector(pos, basis, shifts, e, i, nbr[e], centers, vectors, v);
        const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
        for (u32 k = 0; k < g.n_rbf; ++k) {
            const double x = r - g.centers[k];
            rbf[e * g.n_rbf + k] = (T)exp(-g.gamma * x * x);
        }
        fc[e] = (T)(r < g.cutoff ? 0.5 * (cos(SC_PI * r / g.cutoff) + 1.0) : 0.0);
    }
}

// Per edge: dE/dr_e (f64) from the gradients w.r.t. the Gaussians and the
// cutoff, d/dr in f64 as the CPU's radial functions give it.
template <typename T>
__device__ void edges_bwd(const double* vectors, const T* grad_rbf, const T* grad_fc, SchNetEdgeParams g,
                          u64 n_edges, double* grad_vec) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_edges) return;
    const double v[3] = {vectors[3 * e], vectors[3 * e + 1], vectors[3 * e + 2]};
    const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    double gr = 0.0;
    for (u32 k = 0; k < g.n_rbf; ++k) {
        const double x = r - g.centers[k];
        const double val = exp(-g.gamma * x * x);
        gr += (double)grad_rbf[e * g.n_rbf + k] * (-2.0 * g.gamma * x * val);
    }
    if (r < g.cutoff) gr += (double)grad_fc[e] * (-0.5 * SC_PI / g.cutoff * sin(SC_PI * r / g.cutoff));
    // d|v|/dv = v / |v|; coincident atoms (r = 0) carry no direction.
    const double s = r > 0.0 ? gr / r : 0.0;
    for (int k = 0; k < 3; ++k) grad_vec[3 * e + k] = s * v[k];
}

// Shifted softplus ln(e^x / 2 + 1/2) = softplus(x) - ln 2, stable for large |x|.
template <typename T>
__device__ T ssp(T x) {
    const T sp = x > (T)0 ? x + log1p(exp(-x)) : log1p(exp(x));
    return sp - (T)0.69314718055994530942;
}

// out = ssp(x), n elements.
template <typename T>
__device__ void ssp_copy(const T* x, T* out, u64 n) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = ssp<T>(x[k]);
}

// g *= ssp'(x) = 1 / (1 + e^-x), n elements.
template <typename T>
__device__ void ssp_backward(const T* x, T* g, u64 n) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) g[k] = g[k] * ((T)1 / ((T)1 + exp(-x[k])));
}

// agg[i, c] = sum over edges e of row i (in row order) of
//   xl[nbr_e, c] * (filt[e, c] * fc[e]).
template <typename T>
__device__ void message(const T* xl, const T* filt, const T* fc, const u64* row_start, const u32* nbr,
                        u32 n_rows, u32 f, T* agg) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (u64)n_rows * f) return;
    const u64 i = k / f, c = k % f;
    T acc = (T)0;
    for (u64 e = row_start[i]; e < row_start[i + 1]; ++e) {
        const T w = filt[e * f + c] * fc[e];
        acc += xl[(u64)nbr[e] * f + c] * w;
    }
    agg[k] = acc;
}

// One warp per edge e (receiver i, sender j), lanes over the columns:
//   gfilt[e, c] = (gagg[i, c] * xl[j, c]) * fc[e]
//   gfc[e]     += sum_c (gagg[i, c] * xl[j, c]) * filt[e, c]   (fixed warp tree)
template <typename T>
__device__ void message_bwd_edge(const T* gagg, const T* xl, const T* filt, const T* fc, const u32* centers,
                                 const u32* nbr, u64 n_edges, u32 f, T* gfilt, T* gfc) {
    const u64 e = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const u32 lane = threadIdx.x % 32;
    if (e >= n_edges) return;
    const u64 i = centers[e], j = nbr[e];
    const T w = fc[e];
    T part = (T)0;
    for (u32 c = lane; c < f; c += 32) {
        const T gw = gagg[i * f + c] * xl[j * f + c];
        gfilt[e * f + c] = gw * w;
        part += gw * filt[e * f + c];
    }
    for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
    if (lane == 0) gfc[e] += part;
}

// gxl[j, c] = sum over the edges e that j sends (sender CSR, ascending e) of
//   gagg[receiver_e, c] * (filt[e, c] * fc[e]).
template <typename T>
__device__ void message_bwd_node(const T* gagg, const T* filt, const T* fc, const u64* sender_start,
                                 const u32* sender_edges, const u32* centers, u32 n_rows, u32 f, T* gxl) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (u64)n_rows * f) return;
    const u64 j = k / f, c = k % f;
    T acc = (T)0;
    for (u64 q = sender_start[j]; q < sender_start[j + 1]; ++q) {
        const u64 e = sender_edges[q];
        const T w = filt[e * f + c] * fc[e];
        acc += gagg[(u64)centers[e] * f + c] * w;
    }
    gxl[k] = acc;
}

// energies[i] = e[i] + bias[z_i].
template <typename T>
__device__ void add_species(const T* e, const T* bias, const int* numbers, u32 n_rows, T* energies) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_rows) energies[i] = e[i] + bias[numbers[i]];
}

// The gradient of the owned atoms' energy sum w.r.t. the readout's hidden
// activations: row i = v (width w) for i < n_owned, zero for ghost rows.
template <typename T>
__device__ void readout_seed(const T* v, u32 n_owned, u32 n_rows, u32 w, T* g) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < (u64)n_rows * w) g[k] = k / w < n_owned ? v[k % w] : (T)0;
}

#define INSTANTIATE(T, SUF)                                                                                  \
    extern "C" __global__ void sc_edges_##SUF(const double* pos, const double* basis, const u64* row_start,  \
                                              const u32* nbr, const int* shifts, SchNetEdgeParams g,         \
                                              u32 n_atoms, u32* centers, double* vectors, T* rbf, T* fc) {   \
        edges<T>(pos, basis, row_start, nbr, shifts, g, n_atoms, centers, vectors, rbf, fc);                \
    }                                                                                                        \
    extern "C" __global__ void sc_edges_bwd_##SUF(const double* vectors, const T* grad_rbf, const T* grad_fc, \
                                                  SchNetEdgeParams g, u64 n_edges, double* grad_vec) {      \
        edges_bwd<T>(vectors, grad_rbf, grad_fc, g, n_edges, grad_vec);                                      \
    }                                                                                                        \
    extern "C" __global__ void sc_ssp_copy_##SUF(const T* x, T* out, u64 n) { ssp_copy<T>(x, out, n); }      \
    extern "C" __global__ void sc_ssp_backward_##SUF(const T* x, T* g, u64 n) { ssp_backward<T>(x, g, n); }  \
    extern "C" __global__ void sc_message_##SUF(const T* xl, const T* filt, const T* fc, const u64* row_start, \
                                                const u32* nbr, u32 n_rows, u32 f, T* agg) {                 \
        message<T>(xl, filt, fc, row_start, nbr, n_rows, f, agg);                                            \
    }                                                                                                        \
    extern "C" __global__ void sc_message_bwd_edge_##SUF(const T* gagg, const T* xl, const T* filt,          \
                                                         const T* fc, const u32* centers, const u32* nbr,    \
                                                         u64 n_edges, u32 f, T* gfilt, T* gfc) {             \
        message_bwd_edge<T>(gagg, xl, filt, fc, centers, nbr, n_edges, f, gfilt, gfc);                       \
    }                                                                                                        \
    extern "C" __global__ void sc_message_bwd_node_##SUF(const T* gagg, const T* filt, const T* fc,          \
                                                         const u64* sender_start, const u32* sender_edges,   \
                                                         const u32* centers, u32 n_rows, u32 f, T* gxl) {    \
        message_bwd_node<T>(gagg, filt, fc, sender_start, sender_edges, centers, n_rows, f, gxl);            \
    }                                                                                                        \
    extern "C" __global__ void sc_add_species_##SUF(const T* e, const T* bias, const int* numbers, u32 n_rows, \
                                                    T* energies) {                                           \
        add_species<T>(e, bias, numbers, n_rows, energies);                                                  \
    }                                                                                                        \
    extern "C" __global__ void sc_readout_seed_##SUF(const T* v, u32 n_owned, u32 n_rows, u32 w, T* g) {    \
        readout_seed<T>(v, n_owned, n_rows, w, g);                                                           \
    }

INSTANTIATE(double, f64)
INSTANTIATE(float, f32)
