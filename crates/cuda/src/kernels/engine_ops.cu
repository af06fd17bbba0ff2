// The engine's generic ops on the GPU (ddmlip_engine::device::DeviceBackend):
// element-wise maps and their derivatives, binary ops with broadcasting, row
// and column sums, row gathers, sums over inverse maps (CSR), radial bases.
// Every template is instantiated for double (suffix _f64) and float (_f32).
//
// Determinism: no atomics. Each output element is written by one thread (or
// one block, whose partial sums meet in a fixed tree), so a run gives the
// same bits every time.

typedef unsigned int u32;
typedef unsigned long long u64;

#define EO_PI 3.14159265358979323846
#define EO_THREADS 256

// Unary codes: the order of `UnaryCode` in engine_backend.rs.
#define U_SILU 0
#define U_TANH 1
#define U_SIGMOID 2
#define U_SSP 3
#define U_EXP 4
#define U_LN 5
#define U_SQRT 6
#define U_SQUARE 7
#define U_RECIP 8
#define U_NEG 9
#define U_SCALE 10
#define U_ADD_SCALAR 11
#define U_POWF 12
#define U_SCALED_SILU 13
#define U_COS 14
#define U_SIN 15

template <typename T>
__device__ __forceinline__ T powi_t(T x, int n) {
    // Square-and-multiply from the lowest bit, as the host's powi.
    T base = x;
    unsigned e = n < 0 ? (unsigned)(-n) : (unsigned)n;
    T acc = (T)1;
    while (true) {
        if (e & 1u) acc *= base;
        e >>= 1;
        if (e == 0) break;
        base *= base;
    }
    return n < 0 ? (T)1 / acc : acc;
}

template <typename T>
__device__ __forceinline__ T power_t(T x, double p) {
    if (p == floor(p) && fabs(p) <= 16.0) return powi_t<T>(x, (int)p);
    return pow(x, (T)p);
}

template <typename T>
__device__ __forceinline__ T softplus_t(T x) {
    T ax = x < (T)0 ? -x : x;
    return (x > (T)0 ? x : (T)0) + log1p(exp(-ax));
}

template <typename T>
__device__ __forceinline__ T unary_apply(int code, double p, T x) {
    const T one = (T)1;
    switch (code) {
        case U_SILU: return x / (one + exp(-x));
        case U_TANH: return tanh(x);
        case U_SIGMOID: return one / (one + exp(-x));
        case U_SSP: return softplus_t<T>(x) - (T)0.69314718055994530942;
        case U_EXP: return exp(x);
        case U_LN: return log(x);
        case U_SQRT: return sqrt(x);
        case U_SQUARE: return x * x;
        case U_RECIP: return one / x;
        case U_NEG: return -x;
        case U_SCALE: return (T)p * x;
        case U_ADD_SCALAR: return x + (T)p;
        case U_POWF: return power_t<T>(x, p);
        case U_SCALED_SILU: return (T)p * x / (one + exp(-x));
        case U_COS: return cos(x);
        default: return sin(x);
    }
}

// dy/dx at x, with y = f(x).
template <typename T>
__device__ __forceinline__ T unary_derivative(int code, double p, T x, T y) {
    const T one = (T)1;
    switch (code) {
        case U_SILU: {
            T s = one / (one + exp(-x));
            return s * (one + x * (one - s));
        }
        case U_SCALED_SILU: {
            T s = one / (one + exp(-x));
            return (T)p * s * (one + x * (one - s));
        }
        case U_TANH: return one - y * y;
        case U_SIGMOID: return y * (one - y);
        case U_SSP: return one / (one + exp(-x));
        case U_EXP: return y;
        case U_LN: return one / x;
        case U_SQRT: return (T)0.5 / y;
        case U_SQUARE: return (T)2 * x;
        case U_RECIP: return -y * y;
        case U_NEG: return -one;
        case U_SCALE: return (T)p;
        case U_ADD_SCALAR: return one;
        case U_POWF: return (T)p * power_t<T>(x, p - 1.0);
        case U_COS: return -sin(x);
        default: return cos(x);
    }
}

template <typename T>
__device__ __forceinline__ void store(T* out, u64 i, T v, int accumulate) {
    if (accumulate) out[i] += v; else out[i] = v;
}

template <typename T>
__device__ void axpy(double alpha, const T* x, T* y, u64 n, int accumulate) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store<T>(y, i, (T)alpha * x[i], accumulate);
}

template <typename T>
__device__ void unary(int code, double p, const T* x, T* out, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = unary_apply<T>(code, p, x[i]);
}

template <typename T>
__device__ void unary_grad(int code, double p, const T* x, const T* y, const T* g, T* out, u64 n,
                           int accumulate) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store<T>(out, i, g[i] * unary_derivative<T>(code, p, x[i], y[i]), accumulate);
}

// op: 0 add, 1 sub, 2 mul. bc: 0 full, 1 per row, 2 per column, 3 scalar.
template <typename T>
__device__ void binary(int op, int bc, const T* a, const T* b, T* out, u64 rows, u64 cols,
                       int accumulate) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    u64 j = bc == 0 ? i : bc == 1 ? i / cols : bc == 2 ? i % cols : 0;
    T x = a[i], y = b[j];
    T v = op == 0 ? x + y : op == 1 ? x - y : x * y;
    store<T>(out, i, v, accumulate);
}

// out[r] (+)= Σ_c x[r, c], columns in order (the host's order).
template <typename T>
__device__ void row_sums(const T* x, T* out, u64 rows, u64 cols, int accumulate) {
    u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    T s = (T)0;
    for (u64 c = 0; c < cols; ++c) s += x[r * cols + c];
    store<T>(out, r, s, accumulate);
}

// Block sum of one double per thread, in a fixed tree; thread 0 gets it.
__device__ __forceinline__ double block_sum(double v) {
    __shared__ double part[EO_THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = EO_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    return part[0];
}

// out[c] (+)= Σ_r x[r, c]: one block per column, rows strided over the
// threads, in f64.
template <typename T>
__device__ void col_sums(const T* x, T* out, u64 rows, u64 cols, int accumulate) {
    u64 c = blockIdx.x;
    double s = 0.0;
    for (u64 r = threadIdx.x; r < rows; r += EO_THREADS) s += (double)x[r * cols + c];
    s = block_sum(s);
    if (threadIdx.x == 0) store<T>(out, c, (T)s, accumulate);
}

template <typename T>
__device__ void gather_rows(const T* src, const u32* index, T* out, u64 rows, u64 cols) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    u64 r = i / cols, c = i % cols;
    out[i] = src[(u64)index[r] * cols + c];
}

// dst[r, dst_col0 + c] = src[r, src_col0 + c] for c < width (one thread per
// copied element); dst's other columns are left alone.
template <typename T>
__device__ void copy_cols(const T* src, u64 src_cols, u64 src_col0, T* dst, u64 dst_cols, u64 dst_col0,
                          u64 rows, u64 width) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * width) return;
    u64 r = i / width, c = i % width;
    dst[r * dst_cols + dst_col0 + c] = src[r * src_cols + src_col0 + c];
}

// out[t, c] (+)= Σ src[s, c] over the sources s of target t in ascending
// order, in f64: one thread per output element.
template <typename T>
__device__ void sum_rows_csr(const T* src, const u32* offsets, const u32* sources, int has_sources,
                             T* out, u64 targets, u64 cols, int accumulate) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= targets * cols) return;
    u64 t = i / cols, c = i % cols;
    double s = 0.0;
    for (u32 k = offsets[t]; k < offsets[t + 1]; ++k) {
        u64 row = has_sources ? (u64)sources[k] : (u64)k;
        s += (double)src[row * cols + c];
    }
    store<T>(out, i, (T)s, accumulate);
}

// The same sums with one block per output element, for few targets with
// many sources each (a system's energy over its atoms): the sources strided
// over the threads, the partials in a fixed tree.
template <typename T>
__device__ void sum_rows_csr_wide(const T* src, const u32* offsets, const u32* sources,
                                  int has_sources, T* out, u64 cols, int accumulate) {
    u64 i = blockIdx.x;
    u64 t = i / cols, c = i % cols;
    double s = 0.0;
    for (u64 k = offsets[t] + threadIdx.x; k < offsets[t + 1]; k += EO_THREADS) {
        u64 row = has_sources ? (u64)sources[k] : k;
        s += (double)src[row * cols + c];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) store<T>(out, i, (T)s, accumulate);
}

// Radial kinds: 0 Gaussian, 1 Bessel, 2 cosine cutoff, 3 polynomial cutoff.
// Values and derivatives in f64, rounded once (as the host).
template <typename T>
__device__ void radial(int kind, const double* centers, double gamma, double cutoff, int p, u64 k,
                       const T* d, T* val, T* der, u64 rows) {
    u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    double x = (double)d[r];
    for (u64 c = 0; c < k; ++c) {
        double v = 0.0, dv = 0.0;
        if (kind == 0) {
            double u = x - centers[c];
            v = exp(-gamma * u * u);
            dv = -2.0 * gamma * u * v;
        } else if (kind == 1) {
            double pre = sqrt(2.0 / cutoff);
            double w = (double)(c + 1) * EO_PI / cutoff;
            double s = sin(w * x), co = cos(w * x);
            v = pre * s / x;
            dv = pre * (w * x * co - s) / (x * x);
        } else if (kind == 2) {
            if (x < cutoff) {
                v = 0.5 * (cos(EO_PI * x / cutoff) + 1.0);
                dv = -0.5 * EO_PI / cutoff * sin(EO_PI * x / cutoff);
            }
        } else {
            double u = x / cutoff;
            if (u < 1.0) {
                double pf = (double)p;
                double a = (pf + 1.0) * (pf + 2.0) / 2.0, b = pf * (pf + 2.0), cc = pf * (pf + 1.0) / 2.0;
                double up = 1.0;
                for (int q = 0; q < p; ++q) up *= u;
                v = 1.0 - a * up + b * up * u - cc * up * u * u;
                dv = (-a * pf * up / u + b * (pf + 1.0) * up - cc * (pf + 2.0) * up * u) / cutoff;
            }
        }
        val[r * k + c] = (T)v;
        der[r * k + c] = (T)dv;
    }
}

// Edge vectors r[j] - r[i], then + S_a * cell_a for each axis a with S_a != 0,
// in S (T, or double for an f32 graph's exact positions): the host's order of
// operations, so with --fmad=false the same bits. Vectors rounded to T; the
// length of the S vector, rounded once.
template <typename S>
__device__ __forceinline__ void edge_vector(const S* pos, const S* cell, const u32* center,
                                            const u32* neighbor, const int* shifts,
                                            const u32* systems, int periodic, u64 e, S v[3]) {
    u64 i = 3 * (u64)center[e], j = 3 * (u64)neighbor[e];
    v[0] = pos[j] - pos[i];
    v[1] = pos[j + 1] - pos[i + 1];
    v[2] = pos[j + 2] - pos[i + 2];
    if (periodic) {
        u64 base = 9 * (u64)systems[e];
        for (int a = 0; a < 3; ++a) {
            int sa = shifts[3 * e + a];
            if (sa != 0) {
                for (int k = 0; k < 3; ++k) v[k] += (S)sa * cell[base + 3 * a + k];
            }
        }
    }
}

template <typename T, typename S>
__device__ void edge_geometry(const S* pos, const S* cell, const u32* center, const u32* neighbor,
                              const int* shifts, const u32* systems, int periodic, T* vectors,
                              int want_vectors, T* lengths, int want_lengths, u64 n) {
    u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    S v[3];
    edge_vector<S>(pos, cell, center, neighbor, shifts, systems, periodic, e, v);
    if (want_vectors) {
        for (int k = 0; k < 3; ++k) vectors[3 * e + k] = (T)v[k];
    }
    if (want_lengths) lengths[e] = (T)sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
}

// rows[e] = (g[e] / lengths[e]) * v_e in T (0 for a zero length).
template <typename T, typename S>
__device__ void length_rows(const S* pos, const S* cell, const u32* center, const u32* neighbor,
                            const int* shifts, const u32* systems, int periodic, const T* g,
                            const T* lengths, T* rows, u64 n) {
    u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    S v[3];
    edge_vector<S>(pos, cell, center, neighbor, shifts, systems, periodic, e, v);
    T scale = lengths[e] > (T)0 ? g[e] / lengths[e] : (T)0;
    for (int k = 0; k < 3; ++k) rows[3 * e + k] = scale * (T)v[k];
}

// out[e, 3a + k] = S_e,a * rows[e, k].
template <typename T>
__device__ void shift_outer(const int* shifts, const T* rows, T* out, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 9 * n) return;
    u64 e = i / 9, a = (i % 9) / 3, k = i % 3;
    out[i] = (T)shifts[3 * e + a] * rows[3 * e + k];
}

// out[r, k] = x[r, k] + sum_m x[r, m] * eps_s[m, k].
template <typename T>
__device__ void strain_rows(const T* x, const T* eps, const u32* system, T* out, u64 rows) {
    u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const T* e = eps + 9 * (u64)system[r];
    for (int k = 0; k < 3; ++k) {
        T v = x[3 * r + k];
        for (int m = 0; m < 3; ++m) v += x[3 * r + m] * e[3 * m + k];
        out[3 * r + k] = v;
    }
}

// out[r, m] (+)= g[r, m] + sum_k g[r, k] * eps_s[m, k].
template <typename T>
__device__ void strain_rows_grad(const T* eps, const u32* system, const T* g, T* out, u64 rows,
                                 int accumulate) {
    u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const T* e = eps + 9 * (u64)system[r];
    for (int m = 0; m < 3; ++m) {
        T v = g[3 * r + m];
        for (int k = 0; k < 3; ++k) v += g[3 * r + k] * e[3 * m + k];
        store<T>(out, 3 * r + m, v, accumulate);
    }
}

// out[r, 3m + k] = x[r, m] * g[r, k].
template <typename T>
__device__ void row_outer(const T* x, const T* g, T* out, u64 rows) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 9 * rows) return;
    u64 r = i / 9, m = (i % 9) / 3, k = i % 3;
    out[i] = x[3 * r + m] * g[3 * r + k];
}

#define GEOMETRY(T, S, SUF)                                                                                  \
    extern "C" __global__ void eo_edge_geometry_##SUF(const S* pos, const S* cell, const u32* center,        \
                                                      const u32* neighbor, const int* shifts,               \
                                                      const u32* systems, int periodic, T* vectors,          \
                                                      int want_vectors, T* lengths, int want_lengths, u64 n) { \
        edge_geometry<T, S>(pos, cell, center, neighbor, shifts, systems, periodic, vectors, want_vectors,   \
                            lengths, want_lengths, n);                                                       \
    }                                                                                                         \
    extern "C" __global__ void eo_length_rows_##SUF(const S* pos, const S* cell, const u32* center,          \
                                                    const u32* neighbor, const int* shifts, const u32* systems, \
                                                    int periodic, const T* g, const T* lengths, T* rows,      \
                                                    u64 n) {                                                  \
        length_rows<T, S>(pos, cell, center, neighbor, shifts, systems, periodic, g, lengths, rows, n);      \
    }

GEOMETRY(double, double, f64)
GEOMETRY(float, float, f32)
GEOMETRY(double, double, exact_f64)
GEOMETRY(float, double, exact_f32)

#define INSTANTIATE(T, SUF)                                                                                   \
    extern "C" __global__ void eo_axpy_##SUF(double alpha, const T* x, T* y, u64 n, int acc) {               \
        axpy<T>(alpha, x, y, n, acc);                                                                         \
    }                                                                                                         \
    extern "C" __global__ void eo_unary_##SUF(int code, double p, const T* x, T* out, u64 n) {               \
        unary<T>(code, p, x, out, n);                                                                         \
    }                                                                                                         \
    extern "C" __global__ void eo_unary_grad_##SUF(int code, double p, const T* x, const T* y, const T* g,   \
                                                   T* out, u64 n, int acc) {                                  \
        unary_grad<T>(code, p, x, y, g, out, n, acc);                                                         \
    }                                                                                                         \
    extern "C" __global__ void eo_binary_##SUF(int op, int bc, const T* a, const T* b, T* out, u64 rows,     \
                                               u64 cols, int acc) {                                           \
        binary<T>(op, bc, a, b, out, rows, cols, acc);                                                        \
    }                                                                                                         \
    extern "C" __global__ void eo_row_sums_##SUF(const T* x, T* out, u64 rows, u64 cols, int acc) {          \
        row_sums<T>(x, out, rows, cols, acc);                                                                 \
    }                                                                                                         \
    extern "C" __global__ void eo_col_sums_##SUF(const T* x, T* out, u64 rows, u64 cols, int acc) {          \
        col_sums<T>(x, out, rows, cols, acc);                                                                 \
    }                                                                                                         \
    extern "C" __global__ void eo_gather_rows_##SUF(const T* src, const u32* index, T* out, u64 rows,        \
                                                    u64 cols) {                                               \
        gather_rows<T>(src, index, out, rows, cols);                                                          \
    }                                                                                                         \
    extern "C" __global__ void eo_copy_cols_##SUF(const T* src, u64 src_cols, u64 src_col0, T* dst,         \
                                                  u64 dst_cols, u64 dst_col0, u64 rows, u64 width) {          \
        copy_cols<T>(src, src_cols, src_col0, dst, dst_cols, dst_col0, rows, width);                          \
    }                                                                                                         \
    extern "C" __global__ void eo_sum_rows_csr_##SUF(const T* src, const u32* offsets, const u32* sources,   \
                                                     int has_sources, T* out, u64 targets, u64 cols,          \
                                                     int acc) {                                               \
        sum_rows_csr<T>(src, offsets, sources, has_sources, out, targets, cols, acc);                         \
    }                                                                                                         \
    extern "C" __global__ void eo_sum_rows_csr_wide_##SUF(const T* src, const u32* offsets,                  \
                                                          const u32* sources, int has_sources, T* out,        \
                                                          u64 cols, int acc) {                                \
        sum_rows_csr_wide<T>(src, offsets, sources, has_sources, out, cols, acc);                             \
    }                                                                                                         \
    extern "C" __global__ void eo_shift_outer_##SUF(const int* shifts, const T* rows, T* out, u64 n) {     \
        shift_outer<T>(shifts, rows, out, n);                                                                 \
    }                                                                                                         \
    extern "C" __global__ void eo_strain_rows_##SUF(const T* x, const T* eps, const u32* system, T* out,     \
                                                    u64 rows) {                                               \
        strain_rows<T>(x, eps, system, out, rows);                                                            \
    }                                                                                                         \
    extern "C" __global__ void eo_strain_rows_grad_##SUF(const T* eps, const u32* system, const T* g, T* out,\
                                                         u64 rows, int acc) {                                 \
        strain_rows_grad<T>(eps, system, g, out, rows, acc);                                                  \
    }                                                                                                         \
    extern "C" __global__ void eo_row_outer_##SUF(const T* x, const T* g, T* out, u64 rows) {                \
        row_outer<T>(x, g, out, rows);                                                                        \
    }                                                                                                         \
    extern "C" __global__ void eo_radial_##SUF(int kind, const double* centers, double gamma, double cutoff, \
                                               int p, u64 k, const T* d, T* val, T* der, u64 rows) {          \
        radial<T>(kind, centers, gamma, cutoff, p, k, d, val, der, rows);                                     \
    }

INSTANTIATE(double, f64)
INSTANTIATE(float, f32)
