// SevenNet on the GPU: edge features, species embedding, the uvu tensor-product
// convolution (forward and backward, the radial MLP's last layer consumed in the
// same pass), gate, readout, forces and virial. Compiled by NVRTC with
// --fmad=false; every kernel template is instantiated for double (suffix _f64)
// and float (suffix _f32).
//
// Determinism: no floating-point atomics. Every output element has exactly one
// writer; sums over edges run over CSR rows in row order, sums over channels by
// a fixed warp tree, so a run gives the same bits every time.
//
// Layouts (row-major): node features N x dim in e3nn's mul-major order
// ([u][m] within an irrep block); edges in the receiver-CSR order of the
// neighbour list (edge e = CSR position); per-edge weights of a chunk by
// (chunk position) x dim_w.

// u32, u64 and edge_vector come from edges.cuh, prepended at compile time.

// ---------------------------------------------------------------------------
// Path tables (built on the host, see `sevennet/tables.rs`).
//
// paths: N_PATH_FIELDS ints per path: d1, d3, mul, in_off, w_off, out_off,
//        nz_begin, nz_end, t_off (offset of the path's d1 x d3 filter in a
//        per-edge filter row of t_size values), range (input range index).
// nz_idx: per nonzero CG entry, (a * d3 + k) and the global SH column b.
// nz_coef: per nonzero CG entry, alpha * C (in T).
// col_path: per weight column t (0..dim_w), its path.
// ranges: per input range r: in_off, mul, d1, first path slot, path count;
//         range_paths: the path indices of each range, in path order.
// col_range: per (range, u) thread slot, the range (u = slot - range_first_slot).
// ---------------------------------------------------------------------------

#define N_PATH_FIELDS 10
#define N_RANGE_FIELDS 6
#define MAX_SH 16

struct ConvParams {
    u32 n_paths;
    u32 dim_in;
    u32 dim_w;
    u32 dim_msg;
    u32 dim_sh;
    u32 n_ranges;
    u32 n_range_slots;
    u32 t_size;
    double inv_den;
    // The message rows' layout within each path's output block: 0 e3nn's
    // (u * d3 + k), 1 component-major (k * mul + u).
    u32 msg_component_major;
    u32 pad;
};

// Column of message component k of copy u in a path's output block.
__device__ __forceinline__ int msg_col(int out_off, int mul, int d3, int u, int k, u32 component_major) {
    return component_major ? out_off + k * mul + u : out_off + u * d3 + k;
}

// Filter matrix of one path for one edge: T[a,k] = inv_den * sum_b alpha C[a,b,k] Y[b]
// (same order of operations as the CPU's ConvPaths::filters).
template <typename T, int D1, int D3>
__device__ __forceinline__ void path_filter(const int* nz_idx, const T* nz_coef, int nz0, int nz1,
                                            const T* y, T inv_den, T* t) {
    for (int q = 0; q < D1 * D3; ++q) t[q] = (T)0;
    for (int z = nz0; z < nz1; ++z) t[nz_idx[2 * z]] += nz_coef[z] * y[nz_idx[2 * z + 1]];
    for (int q = 0; q < D1 * D3; ++q) t[q] *= inv_den;
}

// Calls F<T, D1, D3>(...) for the runtime degrees (d1, d3), each of 1, 3, 5, 7.
#define DISPATCH_D1D3(d1, d3, F, ...)                     \
    switch ((d1) * 8 + (d3)) {                            \
        case 1 * 8 + 1: F<T, 1, 1>(__VA_ARGS__); break;   \
        case 1 * 8 + 3: F<T, 1, 3>(__VA_ARGS__); break;   \
        case 1 * 8 + 5: F<T, 1, 5>(__VA_ARGS__); break;   \
        case 1 * 8 + 7: F<T, 1, 7>(__VA_ARGS__); break;   \
        case 3 * 8 + 1: F<T, 3, 1>(__VA_ARGS__); break;   \
        case 3 * 8 + 3: F<T, 3, 3>(__VA_ARGS__); break;   \
        case 3 * 8 + 5: F<T, 3, 5>(__VA_ARGS__); break;   \
        case 3 * 8 + 7: F<T, 3, 7>(__VA_ARGS__); break;   \
        case 5 * 8 + 1: F<T, 5, 1>(__VA_ARGS__); break;   \
        case 5 * 8 + 3: F<T, 5, 3>(__VA_ARGS__); break;   \
        case 5 * 8 + 5: F<T, 5, 5>(__VA_ARGS__); break;   \
        case 5 * 8 + 7: F<T, 5, 7>(__VA_ARGS__); break;   \
        case 7 * 8 + 1: F<T, 7, 1>(__VA_ARGS__); break;   \
        case 7 * 8 + 3: F<T, 7, 3>(__VA_ARGS__); break;   \
        case 7 * 8 + 5: F<T, 7, 5>(__VA_ARGS__); break;   \
        case 7 * 8 + 7: F<T, 7, 7>(__VA_ARGS__); break;   \
        default: break;                                   \
    }

// Filter rows of a chunk: for positions q in q0..q1 (edge e = idx[q] when
// use_idx, else q) and every path p, T_e,p into filt[(q - q0) * t_size + t_off].
template <typename T, int D1, int D3>
__device__ __forceinline__ void filter_path(const int* path, const int* nz_idx, const T* nz_coef, const T* y,
                                            T inv_den, T* out) {
    T t[D1 * D3];
    path_filter<T, D1, D3>(nz_idx, nz_coef, path[6], path[7], y, inv_den, t);
    for (int q = 0; q < D1 * D3; ++q) out[q] = t[q];
}

template <typename T>
__device__ void filters(const int* paths, const int* nz_idx, const T* nz_coef, const T* sh, const u32* idx,
                        int use_idx, ConvParams c, u64 q0, u64 q1, T* filt) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (q1 - q0) * c.n_paths) return;
    const u64 r = k / c.n_paths;
    const u32 p = (u32)(k % c.n_paths);
    const u64 e = use_idx ? (u64)idx[q0 + r] : q0 + r;
    const int* path = paths + N_PATH_FIELDS * p;
    T* out = filt + r * c.t_size + path[8];
    DISPATCH_D1D3(path[0], path[1], filter_path, path, nz_idx, nz_coef, sh + e * c.dim_sh, (T)c.inv_den, out);
}

// ---------------------------------------------------------------------------
// Forward convolution: one block per receiver row i, threads over weight
// columns t = (path p, channel u). For each edge e of the row (receiver CSR,
// positions row_start[i]..row_start[i+1], weights at w[(e - p0) * dim_w]):
//   A[i][out_off + u*d3 + k] += sum_a T_e[a,k] * (w_e[t] * h_j[in_off + u*d1 + a]).
// ---------------------------------------------------------------------------
template <typename T, int D1, int D3>
__device__ __forceinline__ void conv_fwd_col(const int* path, const T* filt, const T* h, const T* w,
                                             const u64* row_start, const u32* nbr, ConvParams c, u64 p0,
                                             u32 i, int u, T* out) {
    const int in_off = path[3], w_off = path[4], out_off = path[5];
    T acc[D3];
    for (int k = 0; k < D3; ++k) acc[k] = (T)0;
    for (u64 e = row_start[i]; e < row_start[i + 1]; ++e) {
        const u32 j = nbr[e];
        const T* t = filt + (e - p0) * c.t_size + path[8];
        const T we = w[(e - p0) * c.dim_w + w_off + u];
        const T* hj = h + (u64)j * c.dim_in + in_off + u * D1;
        T wh[D1];
        for (int a = 0; a < D1; ++a) wh[a] = we * hj[a];
        for (int k = 0; k < D3; ++k)
            for (int a = 0; a < D1; ++a) acc[k] += t[a * D3 + k] * wh[a];
    }
    T* o = out + (u64)i * c.dim_msg;
    for (int k = 0; k < D3; ++k) o[msg_col(out_off, path[2], D3, u, k, c.msg_component_major)] = acc[k];
}

// Rows r0 + blockIdx.x of the chunk whose edges start at p0.
template <typename T>
__device__ void conv_fwd(const int* paths, const T* filt, const int* col_path, const T* h, const T* w,
                         const u64* row_start, const u32* nbr, ConvParams c, u32 r0, u32 r1, u64 p0,
                         T* out) {
    const u32 i = r0 + blockIdx.x;
    if (i >= r1) return;
    for (u32 t = threadIdx.x; t < c.dim_w; t += blockDim.x) {
        const int p = col_path[t];
        const int* path = paths + N_PATH_FIELDS * p;
        const int u = (int)t - path[4];
        DISPATCH_D1D3(path[0], path[1], conv_fwd_col, path, filt, h, w, row_start, nbr, c, p0, i, u, out);
    }
}

// ---------------------------------------------------------------------------
// Backward, part 1: one warp per sender-CSR position q (edge e = sender_edges[q],
// receiver i = centers[e], sender j = nbr[e]). Lanes run over the channels of
// every path. Writes the weight gradient of every column,
//   gw[q - q0][t] = sum_{a,k} T_e[a,k] h_j[a] gA_i[k]   (CPU order: s_k = sum_a T h, then s_k g_k),
// and adds the filter (SH) gradient of the edge into grad_sh[e] (warp tree sum
// over channels, then inv_den).
// ---------------------------------------------------------------------------
template <typename T, int D1, int D3>
__device__ __forceinline__ void conv_bwd_edge_path(const int* path, const int* nz_idx, const T* nz_coef,
                                                   const T* hj, const T* ga, const T* frow, const T* we,
                                                   T* gwe, int lane, u32 cm, T* gy) {
    const int mul = path[2], in_off = path[3], w_off = path[4], out_off = path[5];
    const T* t = frow + path[8];
    T gt[D1 * D3];
    for (int q = 0; q < D1 * D3; ++q) gt[q] = (T)0;
    for (int u = lane; u < mul; u += 32) {
        T h[D1], g[D3];
        for (int a = 0; a < D1; ++a) h[a] = hj[in_off + u * D1 + a];
        for (int k = 0; k < D3; ++k) g[k] = ga[msg_col(out_off, mul, D3, u, k, cm)];
        T gw = (T)0;
        for (int k = 0; k < D3; ++k) {
            T s = (T)0;
            for (int a = 0; a < D1; ++a) s += t[a * D3 + k] * h[a];
            gw += s * g[k];
        }
        gwe[w_off + u] = gw;
        const T wu = we[w_off + u];
        for (int a = 0; a < D1; ++a) {
            const T wh = wu * h[a];
            for (int k = 0; k < D3; ++k) gt[a * D3 + k] += wh * g[k];
        }
    }
    // Filter adjoint (without inv_den): gy[b] += sum over nonzeros alpha C * gt.
    for (int z = path[6]; z < path[7]; ++z) gy[nz_idx[2 * z + 1]] += nz_coef[z] * gt[nz_idx[2 * z]];
}

template <typename T>
__device__ void conv_bwd_edge(const int* paths, const int* nz_idx, const T* nz_coef, const T* h, const T* filt,
                              const T* w, const T* grad_a, const u32* sender_edges, const u32* centers,
                              const u32* nbr, ConvParams c, u64 q0, u64 q1, T* gw, T* grad_sh) {
    const u64 q = q0 + ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (q >= q1) return;  // whole warps leave together: q is uniform in a warp
    const u32 e = sender_edges[q];
    const u32 i = centers[e], j = nbr[e];
    const T inv_den = (T)c.inv_den;
    const T* frow = filt + (q - q0) * c.t_size;
    const T* hj = h + (u64)j * c.dim_in;
    const T* ga = grad_a + (u64)i * c.dim_msg;
    const T* we = w + (q - q0) * c.dim_w;
    T* gwe = gw + (q - q0) * c.dim_w;
    T gy[MAX_SH];
    for (int b = 0; b < MAX_SH; ++b) gy[b] = (T)0;
    for (u32 p = 0; p < c.n_paths; ++p) {
        const int* path = paths + N_PATH_FIELDS * p;
        DISPATCH_D1D3(path[0], path[1], conv_bwd_edge_path, path, nz_idx, nz_coef, hj, ga, frow, we, gwe,
                      lane, c.msg_component_major, gy);
    }
    // Fixed tree over the 32 lanes: the same bits every run.
    for (u32 b = 0; b < c.dim_sh; ++b) {
        T v = gy[b];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0) grad_sh[(u64)e * c.dim_sh + b] += v * inv_den;
    }
}

// ---------------------------------------------------------------------------
// Backward, part 2: one block per sender row j, threads over input slots
// (range r, channel u): every path reading that input block, in path order,
//   gh_j[in_off + u*d1 + a] += sum_k T_e[a,k] * (w_e[w_off + u] * gA_i[out_off + u*d3 + k]).
// ---------------------------------------------------------------------------
template <typename T, int D1, int D3>
__device__ __forceinline__ void conv_bwd_h_path(const int* path, const T* frow, const T* we, const T* ga, int u,
                                                u32 cm, T* acc) {
    const T* t = frow + path[8];
    const T wu = we[path[4] + u];
    T wg[D3];
    for (int k = 0; k < D3; ++k) wg[k] = wu * ga[msg_col(path[5], path[2], D3, u, k, cm)];
    for (int a = 0; a < D1; ++a)
        for (int k = 0; k < D3; ++k) acc[a] += t[a * D3 + k] * wg[k];
}

template <typename T>
__device__ void conv_bwd_h(const int* paths, const T* filt, const int* ranges, const int* range_paths,
                           const int* slot_range, const T* w, const T* grad_a, const u64* sender_start,
                           const u32* sender_edges, const u32* centers, ConvParams c, u32 r0, u32 r1, u64 q0,
                           T* grad_h) {
    const u32 j = r0 + blockIdx.x;
    if (j >= r1) return;
    for (u32 s = threadIdx.x; s < c.n_range_slots; s += blockDim.x) {
        const int r = slot_range[s];
        const int* range = ranges + N_RANGE_FIELDS * r;
        const int in_off = range[0], d1 = range[2], first_slot = range[3], path0 = range[4],
                  n_paths = range[5];
        const int u = (int)s - first_slot;
        T acc[7] = {0, 0, 0, 0, 0, 0, 0};
        for (u64 q = sender_start[j]; q < sender_start[j + 1]; ++q) {
            const u32 e = sender_edges[q];
            const T* frow = filt + (q - q0) * c.t_size;
            const T* we = w + (q - q0) * c.dim_w;
            const T* ga = grad_a + (u64)centers[e] * c.dim_msg;
            for (int m = 0; m < n_paths; ++m) {
                const int* path = paths + N_PATH_FIELDS * range_paths[path0 + m];
                DISPATCH_D1D3(path[0], path[1], conv_bwd_h_path, path, frow, we, ga, u, c.msg_component_major, acc);
            }
        }
        T* o = grad_h + (u64)j * c.dim_in + in_off + u * d1;
        for (int a = 0; a < d1; ++a) o[a] = acc[a];
    }
}

// ---------------------------------------------------------------------------
// Elementwise pieces.
// ---------------------------------------------------------------------------

// Normalised SiLU and its derivative, as crates/e3nn's nsilu / nsilu_grad.
#define SILU_NORM 1.6791767923989418
template <typename T>
__device__ __forceinline__ T nsilu(T s) {
    return (T)SILU_NORM * s / ((T)1 + exp(-s));
}
template <typename T>
__device__ __forceinline__ T nsilu_grad(T s) {
    const T sig = (T)1 / ((T)1 + exp(-s));
    return (T)SILU_NORM * (sig + s * sig * ((T)1 - sig));
}
#define TANH_NORM 1.5937334472592695

// Activation codes: 0 = normalised SiLU, 1 = normalised tanh.
template <typename T>
__device__ __forceinline__ T act_eval(int kind, T x) {
    return kind == 0 ? nsilu(x) : (T)TANH_NORM * tanh(x);
}
template <typename T>
__device__ __forceinline__ T act_grad(int kind, T x) {
    if (kind == 0) return nsilu_grad(x);
    const T th = tanh(x);
    return (T)TANH_NORM * ((T)1 - th * th);
}

// out = nsilu(z), n elements (hidden layers of the radial MLP).
template <typename T>
__device__ void silu_copy(const T* z, T* out, u64 n) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = nsilu(z[k]);
}

// g *= nsilu'(z), n elements.
template <typename T>
__device__ void silu_backward(const T* z, T* g, u64 n) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) g[k] *= nsilu_grad(z[k]);
}

// Gate forward. Per output column o: kind[o] (0 scalar, 1 gated), src[o] the
// input column, gate[o] the gate's input column (gated only), act[o] the
// scalar activation code; gate_act the gates' activation code.
template <typename T>
__device__ void gate_fwd(const T* y, const int* table, u32 n_rows, u32 dim_in, u32 dim_out, int gate_act,
                         T* out) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (u64)n_rows * dim_out) return;
    const u64 r = k / dim_out;
    const u32 o = (u32)(k % dim_out);
    const int* tb = table + 4 * o;
    const T* x = y + r * dim_in;
    if (tb[0] == 0) {
        out[k] = act_eval<T>(tb[3], x[tb[1]]);
    } else {
        out[k] = act_eval<T>(gate_act, x[tb[2]]) * x[tb[1]];
    }
}

// Gate backward. Per input column c: kind (0 scalar, 1 gate, 2 gated), the
// output column (scalar, gated) or the first output column of the gated copy
// (gate), the input column of the copy's first component (gate) or of its gate
// (gated), the number of components d (gate) or the activation code (scalar).
template <typename T>
__device__ void gate_bwd(const T* y, const T* grad_out, const int* table, u32 n_rows, u32 dim_in,
                         u32 dim_out, int gate_act, T* grad_in) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (u64)n_rows * dim_in) return;
    const u64 r = k / dim_in;
    const u32 ci = (u32)(k % dim_in);
    const int* tb = table + 4 * ci;
    const T* x = y + r * dim_in;
    const T* go = grad_out + r * dim_out;
    if (tb[0] == 0) {
        grad_in[k] = go[tb[1]] * act_grad<T>(tb[3], x[ci]);
    } else if (tb[0] == 1) {
        T dot = (T)0;
        for (int c = 0; c < tb[3]; ++c) dot += go[tb[1] + c] * x[tb[2] + c];
        grad_in[k] = dot * act_grad<T>(gate_act, x[ci]);
    } else {
        grad_in[k] = go[tb[1]] * act_eval<T>(gate_act, x[tb[2]]);
    }
}

// out[r][c] += bias[c] over n_rows x dim.
template <typename T>
__device__ void add_bias(const T* bias, u32 n_rows, u32 dim, T* out) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < (u64)n_rows * dim) out[k] += bias[k % dim];
}

// x0[i] = table[types[i]] (species embedding rows of width dim).
template <typename T>
__device__ void embed_species(const T* table, const int* types, u32 n_rows, u32 dim, T* x) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < (u64)n_rows * dim) x[k] = table[(u64)types[k / dim] * dim + k % dim];
}

// dst[q - q0] = src[idx[q]] for rows of width dim (q in q0..q1).
template <typename T>
__device__ void gather_rows(const T* src, const u32* idx, u64 q0, u64 q1, u32 dim, T* dst) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (q1 - q0) * dim) return;
    const u64 q = q0 + k / dim;
    dst[k] = src[(u64)idx[q] * dim + k % dim];
}

// dst[idx[q]] += src[q - q0] for rows of width dim (each idx[q] distinct).
template <typename T>
__device__ void scatter_add_rows(const T* src, const u32* idx, u64 q0, u64 q1, u32 dim, T* dst) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (q1 - q0) * dim) return;
    const u64 q = q0 + k / dim;
    dst[(u64)idx[q] * dim + k % dim] += src[k];
}

// Readout: e_i = scale[t] * (x_i . v + c) + shift[t].
template <typename T>
__device__ void readout(const T* x, const T* v, T c, const int* types, const T* scale, const T* shift,
                        u32 n_rows, u32 dim, T* energies) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows) return;
    T acc = (T)0;
    for (u32 k = 0; k < dim; ++k) acc += x[(u64)i * dim + k] * v[k];
    const int t = types[i];
    energies[i] = scale[t] * (acc + c) + shift[t];
}

// Gradient of sum_i E_i w.r.t. the last features: row i = scale[t_i] * v.
template <typename T>
__device__ void readout_bwd(const T* v, const int* types, const T* scale, u32 n_rows, u32 dim, T* gx) {
    const u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < (u64)n_rows * dim) gx[k] = scale[types[k / dim]] * v[k % dim];
}

#define INSTANTIATE(T, SUF)                                                                                  \
    extern "C" __global__ void sn_filters_##SUF(const int* paths, const int* nz_idx, const T* nz_coef,       \
                                                const T* sh, const u32* idx, int use_idx, ConvParams c,      \
                                                u64 q0, u64 q1, T* filt) {                                   \
        filters<T>(paths, nz_idx, nz_coef, sh, idx, use_idx, c, q0, q1, filt);                               \
    }                                                                                                        \
    extern "C" __global__ void sn_conv_fwd_##SUF(const int* paths, const T* filt, const int* col_path,      \
                                                 const T* h, const T* w, const u64* row_start,               \
                                                 const u32* nbr, ConvParams c, u32 r0, u32 r1, u64 p0,       \
                                                 T* out) {                                                   \
        conv_fwd<T>(paths, filt, col_path, h, w, row_start, nbr, c, r0, r1, p0, out);                       \
    }                                                                                                        \
    extern "C" __global__ void sn_conv_bwd_edge_##SUF(const int* paths, const int* nz_idx, const T* nz_coef, \
                                                      const T* h, const T* filt, const T* w,                 \
                                                      const T* grad_a, const u32* sender_edges,              \
                                                      const u32* centers, const u32* nbr, ConvParams c,      \
                                                      u64 q0, u64 q1, T* gw, T* grad_sh) {                   \
        conv_bwd_edge<T>(paths, nz_idx, nz_coef, h, filt, w, grad_a, sender_edges, centers, nbr, c, q0, q1,\
                         gw, grad_sh);                                                                       \
    }                                                                                                        \
    extern "C" __global__ void sn_conv_bwd_h_##SUF(                                                          \
        const int* paths, const T* filt, const int* ranges, const int* range_paths, const int* slot_range,  \
        const T* w, const T* grad_a, const u64* sender_start, const u32* sender_edges, const u32* centers,  \
        ConvParams c, u32 r0, u32 r1, u64 q0, T* grad_h) {                                                   \
        conv_bwd_h<T>(paths, filt, ranges, range_paths, slot_range, w, grad_a, sender_start, sender_edges,  \
                      centers, c, r0, r1, q0, grad_h);                                                       \
    }                                                                                                        \
    extern "C" __global__ void sn_silu_copy_##SUF(const T* z, T* out, u64 n) { silu_copy<T>(z, out, n); }   \
    extern "C" __global__ void sn_silu_backward_##SUF(const T* z, T* g, u64 n) { silu_backward<T>(z, g, n); } \
    extern "C" __global__ void sn_gate_fwd_##SUF(const T* y, const int* table, u32 n_rows, u32 dim_in,      \
                                                 u32 dim_out, int gate_act, T* out) {                        \
        gate_fwd<T>(y, table, n_rows, dim_in, dim_out, gate_act, out);                                       \
    }                                                                                                        \
    extern "C" __global__ void sn_gate_bwd_##SUF(const T* y, const T* grad_out, const int* table,           \
                                                 u32 n_rows, u32 dim_in, u32 dim_out, int gate_act,          \
                                                 T* grad_in) {                                               \
        gate_bwd<T>(y, grad_out, table, n_rows, dim_in, dim_out, gate_act, grad_in);                         \
    }                                                                                                        \
    extern "C" __global__ void sn_add_bias_##SUF(const T* bias, u32 n_rows, u32 dim, T* out) {              \
        add_bias<T>(bias, n_rows, dim, out);                                                                 \
    }                                                                                                        \
    extern "C" __global__ void sn_embed_species_##SUF(const T* table, const int* types, u32 n_rows, u32 dim, \
                                                      T* x) {                                                \
        embed_species<T>(table, types, n_rows, dim, x);                                                      \
    }                                                                                                        \
    extern "C" __global__ void sn_gather_rows_##SUF(const T* src, const u32* idx, u64 q0, u64 q1, u32 dim,  \
                                                    T* dst) {                                                \
        gather_rows<T>(src, idx, q0, q1, dim, dst);                                                          \
    }                                                                                                        \
    extern "C" __global__ void sn_scatter_add_rows_##SUF(const T* src, const u32* idx, u64 q0, u64 q1,      \
                                                         u32 dim, T* dst) {                                  \
        scatter_add_rows<T>(src, idx, q0, q1, dim, dst);                                                     \
    }                                                                                                        \
    extern "C" __global__ void sn_readout_##SUF(const T* x, const T* v, T c, const int* types,              \
                                                const T* scale, const T* shift, u32 n_rows, u32 dim,         \
                                                T* energies) {                                               \
        readout<T>(x, v, c, types, scale, shift, n_rows, dim, energies);                                     \
    }                                                                                                        \
    extern "C" __global__ void sn_readout_bwd_##SUF(const T* v, const int* types, const T* scale,           \
                                                    u32 n_rows, u32 dim, T* gx) {                            \
        readout_bwd<T>(v, types, scale, n_rows, dim, gx);                                                    \
    }

INSTANTIATE(double, f64)
INSTANTIATE(float, f32)

// ---------------------------------------------------------------------------
// Edge features in double (also for the f32 network: features computed in
// f64 and rounded once, as the CPU path does), and their backward.
// ---------------------------------------------------------------------------

struct EdgeParams {
    double freqs[16];
    u32 n_basis;
    u32 lmax;
    int envelope;  // 0: XPLOR switch, 1: polynomial
    double cutoff;
    double cutoff_on;  // XPLOR
    double p;          // polynomial exponent
};

__device__ __forceinline__ void envelope_at(const EdgeParams& g, double r, double* f, double* df) {
    const double rc = g.cutoff;
    if (g.envelope == 0) {
        const double on = g.cutoff_on;
        if (r < on) { *f = 1.0; *df = 0.0; return; }
        if (r >= rc) { *f = 0.0; *df = 0.0; return; }
        const double r2 = r * r, on2 = on * on, c2 = rc * rc;
        const double den = (c2 - on2) * (c2 - on2) * (c2 - on2);
        *f = (c2 - r2) * (c2 - r2) * (c2 + 2.0 * r2 - 3.0 * on2) / den;
        *df = 12.0 * r * (c2 - r2) * (on2 - r2) / den;
    } else {
        const double x = r / rc, pf = g.p;
        const double c0 = (pf + 1.0) * (pf + 2.0) / 2.0, c1 = pf * (pf + 2.0), c2 = pf * (pf + 1.0) / 2.0;
        double xp1 = 1.0;
        for (int k = 1; k < (int)pf; ++k) xp1 *= x;
        const double xp = xp1 * x;
        *f = 1.0 - c0 * xp + c1 * xp * x - c2 * xp * x * x;
        *df = (-c0 * pf * xp1 + c1 * (pf + 1.0) * xp - c2 * (pf + 2.0) * xp * x) / rc;
    }
}

// Real SH of a unit vector (e3nn component normalisation), degrees <= 3,
// as crates/e3nn/src/sh.rs.
__device__ void sh_unit(double x, double y, double z, u32 lmax, double* out) {
    out[0] = 1.0;
    if (lmax == 0) return;
    const double s3 = sqrt(3.0);
    out[1] = s3 * x;
    out[2] = s3 * y;
    out[3] = s3 * z;
    if (lmax == 1) return;
    double sh20 = s3 * x * z;
    const double sh21 = s3 * x * y;
    const double y2 = y * y;
    const double x2z2 = x * x + z * z;
    const double sh22 = y2 - 0.5 * x2z2;
    const double sh23 = s3 * y * z;
    double sh24 = (sqrt(3.0) / 2.0) * (z * z - x * x);
    const double s5 = sqrt(5.0);
    out[4] = s5 * sh20;
    out[5] = s5 * sh21;
    out[6] = s5 * sh22;
    out[7] = s5 * sh23;
    out[8] = s5 * sh24;
    if (lmax == 2) return;
    sh20 = s5 * sh20;
    sh24 = s5 * sh24;
    const double a0 = sqrt(42.0) / 6.0, a1 = sqrt(7.0), a2 = sqrt(168.0) / 8.0, a3 = sqrt(7.0) / 2.0;
    out[9] = a0 * (sh20 * z + sh24 * x);
    out[10] = a1 * sh20 * y;
    out[11] = a2 * (4.0 * y2 - x2z2) * x;
    out[12] = a3 * y * (2.0 * y2 - 3.0 * x2z2);
    out[13] = a2 * z * (4.0 * y2 - x2z2);
    out[14] = a1 * sh24 * y;
    out[15] = a0 * (sh24 * z - sh20 * x);
}

__device__ void sh_unit_vjp(double x, double y, double z, u32 lmax, const double* g, double* r) {
    r[0] = r[1] = r[2] = 0.0;
    if (lmax == 0) return;
    const double s3 = sqrt(3.0);
    r[0] += s3 * g[1];
    r[1] += s3 * g[2];
    r[2] += s3 * g[3];
    if (lmax == 1) return;
    const double s5 = s3 * (sqrt(5.0) / sqrt(3.0));
    const double d20[3] = {s3 * z, 0.0, s3 * x};
    const double d21[3] = {s3 * y, s3 * x, 0.0};
    const double d22[3] = {-x, 2.0 * y, -z};
    const double d23[3] = {0.0, s3 * z, s3 * y};
    const double d24[3] = {-s3 * x, 0.0, s3 * z};
    for (int k = 0; k < 3; ++k)
        r[k] += s5 * (g[4] * d20[k] + g[5] * d21[k] + g[6] * d22[k] + g[7] * d23[k] + g[8] * d24[k]);
    if (lmax == 2) return;
    const double s15 = sqrt(15.0);
    const double sh20 = s15 * x * z;
    const double sh24 = (sqrt(15.0) / 2.0) * (z * z - x * x);
    const double e20[3] = {s15 * z, 0.0, s15 * x};
    const double e24[3] = {-s15 * x, 0.0, s15 * z};
    const double y2 = y * y, x2z2 = x * x + z * z;
    const double a0 = sqrt(42.0) / 6.0, a1 = sqrt(7.0), a2 = sqrt(168.0) / 8.0, a3 = sqrt(7.0) / 2.0;
    const double p = 4.0 * y2 - x2z2;
    const double d30[3] = {a0 * (z * e20[0] + x * e24[0] + sh24), 0.0, a0 * (z * e20[2] + sh20 + x * e24[2])};
    const double d31[3] = {a1 * y * e20[0], a1 * sh20, a1 * y * e20[2]};
    const double d32[3] = {a2 * (p - 2.0 * x * x), a2 * 8.0 * y * x, a2 * (-2.0 * z * x)};
    const double d33[3] = {a3 * y * (-6.0 * x), a3 * (6.0 * y2 - 3.0 * x2z2), a3 * y * (-6.0 * z)};
    const double d34[3] = {a2 * z * (-2.0 * x), a2 * z * 8.0 * y, a2 * (p - 2.0 * z * z)};
    const double d35[3] = {a1 * y * e24[0], a1 * sh24, a1 * y * e24[2]};
    const double d36[3] = {a0 * (z * e24[0] - x * e20[0] - sh20), 0.0, a0 * (z * e24[2] + sh24 - x * e20[2])};
    for (int k = 0; k < 3; ++k)
        r[k] += g[9] * d30[k] + g[10] * d31[k] + g[11] * d32[k] + g[12] * d33[k] + g[13] * d34[k] +
                g[14] * d35[k] + g[15] * d36[k];
}

// Per edge e (receiver CSR order): receiver index, vector
// r_e = r_j + S.cell - r_i (f64, the CPU list's order of operations),
// and, in T, the radial embedding (n_basis) and SH (sh_dim).
template <typename T>
__device__ void edge_features(const double* pos, const double* basis, const u64* row_start,
                              const u32* nbr, const int* shifts, EdgeParams g, u32 n_atoms,
                              u32* centers, double* vectors, T* emb, T* sh) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_atoms) return;
    const u32 ds = (g.lmax + 1) * (g.lmax + 1);
    for (u64 e = row_start[i]; e < row_start[i + 1]; ++e) {
        double v[3];
        edge_vector(pos, basis, shifts, e, i, nbr[e], centers, vectors, v);
        const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
        double f, df;
        envelope_at(g, r, &f, &df);
        const double pref = 2.0 / g.cutoff;
        for (u32 n = 0; n < g.n_basis; ++n) emb[e * g.n_basis + n] = (T)(pref * sin(g.freqs[n] * r) / r * f);
        const double d = r > 1e-12 ? r : 1e-12;
        double y[MAX_SH];
        sh_unit(v[0] / d, v[1] / d, v[2] / d, g.lmax, y);
        for (u32 b = 0; b < ds; ++b) sh[e * ds + b] = (T)y[b];
    }
}

// dE/dv (f64) of one edge vector v from the gradients of its embedding
// (gemb, n_basis values) and SH (gsh, (lmax+1)^2 values).
template <typename T>
__device__ void edge_vector_grad(const double* v, const T* gemb, const T* gsh, const EdgeParams& g,
                                 double* out) {
    const u32 ds = (g.lmax + 1) * (g.lmax + 1);
    const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    double f, df;
    envelope_at(g, r, &f, &df);
    const double pref = 2.0 / g.cutoff;
    double gl = 0.0;
    for (u32 n = 0; n < g.n_basis; ++n) {
        const double c = g.freqs[n];
        const double s = sin(c * r), co = cos(c * r);
        const double b = pref * s / r;
        const double db = pref * (c * r * co - s) / (r * r);
        gl += (double)gemb[n] * (db * f + b * df);
    }
    out[0] = gl * v[0] / r;
    out[1] = gl * v[1] / r;
    out[2] = gl * v[2] / r;
    const bool clamped = !(r > 1e-12);
    const double d = clamped ? 1e-12 : r;
    const double u[3] = {v[0] / d, v[1] / d, v[2] / d};
    double gs[MAX_SH];
    for (u32 b = 0; b < MAX_SH; ++b) gs[b] = b < ds ? (double)gsh[b] : 0.0;
    double gu[3];
    sh_unit_vjp(u[0], u[1], u[2], g.lmax, gs, gu);
    if (clamped) {
        for (int k = 0; k < 3; ++k) out[k] += gu[k] / d;
    } else {
        const double dot = gu[0] * u[0] + gu[1] * u[1] + gu[2] * u[2];
        for (int k = 0; k < 3; ++k) out[k] += (gu[k] - dot * u[k]) / d;
    }
}

// Per edge: dE/dr_e (f64) from the gradients w.r.t. the embedding and SH.
template <typename T>
__device__ void edge_features_bwd(const double* vectors, const T* grad_emb, const T* grad_sh, EdgeParams g,
                                  u64 n_edges, double* grad_vec) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_edges) return;
    const u32 ds = (g.lmax + 1) * (g.lmax + 1);
    const double v[3] = {vectors[3 * e], vectors[3 * e + 1], vectors[3 * e + 2]};
    double out[3];
    edge_vector_grad<T>(v, grad_emb + e * g.n_basis, grad_sh + e * ds, g, out);
    for (int k = 0; k < 3; ++k) grad_vec[3 * e + k] = out[k];
}

// The op engine's edge features: from edge vectors in T (computed in f64,
// rounded once) rows [embedding (n_basis) | SH ((lmax+1)^2)], and back.
template <typename T>
__device__ void edge_rows(const T* vectors, EdgeParams g, u64 n_edges, T* out) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_edges) return;
    const u32 ds = (g.lmax + 1) * (g.lmax + 1);
    T* row = out + e * (g.n_basis + ds);
    const double v[3] = {(double)vectors[3 * e], (double)vectors[3 * e + 1], (double)vectors[3 * e + 2]};
    const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    double f, df;
    envelope_at(g, r, &f, &df);
    const double pref = 2.0 / g.cutoff;
    for (u32 n = 0; n < g.n_basis; ++n) row[n] = (T)(pref * sin(g.freqs[n] * r) / r * f);
    const double d = r > 1e-12 ? r : 1e-12;
    double y[MAX_SH];
    sh_unit(v[0] / d, v[1] / d, v[2] / d, g.lmax, y);
    for (u32 b = 0; b < ds; ++b) row[g.n_basis + b] = (T)y[b];
}

template <typename T>
__device__ void edge_rows_bwd(const T* vectors, const T* grad, EdgeParams g, u64 n_edges, T* grad_vec) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_edges) return;
    const u32 ds = (g.lmax + 1) * (g.lmax + 1);
    const T* row = grad + e * (g.n_basis + ds);
    const double v[3] = {(double)vectors[3 * e], (double)vectors[3 * e + 1], (double)vectors[3 * e + 2]};
    double out[3];
    edge_vector_grad<T>(v, row, row + g.n_basis, g, out);
    for (int k = 0; k < 3; ++k) grad_vec[3 * e + k] = (T)out[k];
}

extern "C" __global__ void sn_edge_features_f64(const double* pos, const double* basis, const u64* row_start,
                                                const u32* nbr, const int* shifts, EdgeParams g, u32 n_atoms,
                                                u32* centers, double* vectors, double* emb, double* sh) {
    edge_features<double>(pos, basis, row_start, nbr, shifts, g, n_atoms, centers, vectors, emb, sh);
}
extern "C" __global__ void sn_edge_features_f32(const double* pos, const double* basis, const u64* row_start,
                                                const u32* nbr, const int* shifts, EdgeParams g, u32 n_atoms,
                                                u32* centers, double* vectors, float* emb, float* sh) {
    edge_features<float>(pos, basis, row_start, nbr, shifts, g, n_atoms, centers, vectors, emb, sh);
}
extern "C" __global__ void sn_edge_features_bwd_f64(const double* vectors, const double* grad_emb,
                                                    const double* grad_sh, EdgeParams g, u64 n_edges,
                                                    double* grad_vec) {
    edge_features_bwd<double>(vectors, grad_emb, grad_sh, g, n_edges, grad_vec);
}
extern "C" __global__ void sn_edge_features_bwd_f32(const double* vectors, const float* grad_emb,
                                                    const float* grad_sh, EdgeParams g, u64 n_edges,
                                                    double* grad_vec) {
    edge_features_bwd<float>(vectors, grad_emb, grad_sh, g, n_edges, grad_vec);
}
extern "C" __global__ void sn_edge_rows_f64(const double* vectors, EdgeParams g, u64 n_edges, double* out) {
    edge_rows<double>(vectors, g, n_edges, out);
}
extern "C" __global__ void sn_edge_rows_f32(const float* vectors, EdgeParams g, u64 n_edges, float* out) {
    edge_rows<float>(vectors, g, n_edges, out);
}
extern "C" __global__ void sn_edge_rows_bwd_f64(const double* vectors, const double* grad, EdgeParams g,
                                                u64 n_edges, double* grad_vec) {
    edge_rows_bwd<double>(vectors, grad, g, n_edges, grad_vec);
}
extern "C" __global__ void sn_edge_rows_bwd_f32(const float* vectors, const float* grad, EdgeParams g,
                                                u64 n_edges, float* grad_vec) {
    edge_rows_bwd<float>(vectors, grad, g, n_edges, grad_vec);
}

// ---------------------------------------------------------------------------
// Sender CSR: counts per sender (integer atomics), then, after an exclusive
// scan, the fill (integer atomics) and a sort of every row by edge index, so
// the fill order cannot change anything downstream.
// ---------------------------------------------------------------------------
extern "C" __global__ void sn_sender_count(const u32* nbr, u64 n_edges, u32* counts) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n_edges) atomicAdd(&counts[nbr[e]], 1u);
}

extern "C" __global__ void sn_sender_fill(const u32* nbr, u64 n_edges, const u64* start, u32* cursor,
                                          u32* sender_edges) {
    const u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_edges) return;
    const u32 j = nbr[e];
    const u32 slot = atomicAdd(&cursor[j], 1u);
    sender_edges[start[j] + slot] = (u32)e;
}

extern "C" __global__ void sn_sender_sort(const u64* start, u32 n_atoms, u32* sender_edges) {
    const u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_atoms) return;
    const u64 lo = start[j], hi = start[j + 1];
    for (u64 k = lo + 1; k < hi; ++k) {
        const u32 v = sender_edges[k];
        u64 m = k;
        while (m > lo && sender_edges[m - 1] > v) {
            sender_edges[m] = sender_edges[m - 1];
            --m;
        }
        sender_edges[m] = v;
    }
}

// ---------------------------------------------------------------------------
// Forces and per-atom virials from dE/dr_e (f64):
//   F_i = sum_{e: center i} g_e - sum_{e: neighbour i} g_e,
//   W_i = sum_{e: center i} (r_x g_x, r_y g_y, r_z g_z, r_y g_z, r_z g_x, r_x g_y)
// (sevenn's off-diagonal choice), each in row order.
// ---------------------------------------------------------------------------
extern "C" __global__ void sn_forces_virial(const double* vectors, const double* grad_vec, const u64* row_start,
                                            const u64* sender_start, const u32* sender_edges, u32 n_atoms,
                                            double* forces, double* virial) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_atoms) return;
    double f[3] = {0.0, 0.0, 0.0}, w[6] = {0, 0, 0, 0, 0, 0};
    for (u64 e = row_start[i]; e < row_start[i + 1]; ++e) {
        const double* g = grad_vec + 3 * e;
        const double* r = vectors + 3 * e;
        for (int k = 0; k < 3; ++k) f[k] += g[k];
        w[0] += r[0] * g[0];
        w[1] += r[1] * g[1];
        w[2] += r[2] * g[2];
        w[3] += r[1] * g[2];
        w[4] += r[2] * g[0];
        w[5] += r[0] * g[1];
    }
    for (u64 q = sender_start[i]; q < sender_start[i + 1]; ++q) {
        const double* g = grad_vec + 3 * (u64)sender_edges[q];
        for (int k = 0; k < 3; ++k) f[k] -= g[k];
    }
    for (int k = 0; k < 3; ++k) forces[3 * i + k] = f[k];
    for (int k = 0; k < 6; ++k) virial[6 * i + k] = w[k];
}
