// ddmlip CUDA kernels: cell-list neighbour list (CSR by centre) and the
// Lennard-Jones pair potential. Compiled by NVRTC with --fmad=false so that
// every pair vector and cutoff decision is bit-for-bit the CPU's.
//
// Determinism: no floating-point atomics anywhere. Integer atomics only fill
// bins, whose contents are then sorted; per-atom sums run over CSR rows in
// row order; totals come from fixed-order block reductions.

typedef unsigned int u32;
typedef unsigned long long u64;

// Search geometry prepared on the host (see `neighbors.rs`).
struct Geometry {
    double basis[9];    // rows: lattice vectors (periodic) or unit vectors (open)
    double inverse[9];  // frac = cart · inverse
    double lo[3];       // fractional origin of the bins (0 on periodic axes)
    double width[3];    // fractional width of one bin
    double cutoff2;     // squared cutoff (Å²)
    int pbc[3];
    int nbins[3];
    int reach[3];       // stencil half-width in bins
    u32 n_atoms;
};

__device__ __forceinline__ void shift_cartesian(const Geometry& g, const int s[3], double out[3]) {
    // Same order of operations as ddmlip_neighbors::Frame::shift_cartesian.
    for (int k = 0; k < 3; ++k) {
        out[k] = (double)s[0] * g.basis[0 * 3 + k] + (double)s[1] * g.basis[1 * 3 + k]
                 + (double)s[2] * g.basis[2 * 3 + k];
    }
}

__device__ __forceinline__ int floor_div(int a, int n) {
    int q = a / n;
    if ((a % n != 0) && ((a < 0) != (n < 0))) q -= 1;
    return q;
}

// Per atom: wrap count along periodic axes, bin, and bin occupancy.
extern "C" __global__ void nl_bin_atoms(const double* pos, Geometry g, int* wrap, u32* atom_bin,
                                        u32* bin_count) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.n_atoms) return;
    double r[3] = {pos[3 * i], pos[3 * i + 1], pos[3 * i + 2]};
    int b[3];
    for (int k = 0; k < 3; ++k) {
        double f = r[0] * g.inverse[0 * 3 + k] + r[1] * g.inverse[1 * 3 + k] + r[2] * g.inverse[2 * 3 + k];
        int w = 0;
        double u;
        if (g.pbc[k]) {
            double fl = floor(f);
            w = (int)fl;
            u = (f - fl) / g.width[k];
        } else {
            u = (f - g.lo[k]) / g.width[k];
        }
        int bk = (int)floor(u);
        if (bk < 0) bk = 0;
        if (bk >= g.nbins[k]) bk = g.nbins[k] - 1;
        b[k] = bk;
        wrap[3 * i + k] = w;
    }
    u32 bin = ((u32)b[0] * (u32)g.nbins[1] + (u32)b[1]) * (u32)g.nbins[2] + (u32)b[2];
    atom_bin[i] = bin;
    atomicAdd(&bin_count[bin], 1u);
}

// Exclusive prefix sum of `n` counts into `out[0..=n]` (out[n] = total), by
// one block of 1024 threads: each thread scans a contiguous chunk.
extern "C" __global__ void scan_counts(const u32* counts, u64* out, u32 n) {
    __shared__ u64 sums[1024];
    u32 t = threadIdx.x;
    u32 chunk = (n + 1023) / 1024;
    u32 begin = t * chunk;
    u32 end = begin + chunk;
    if (begin > n) begin = n;
    if (end > n) end = n;
    u64 local = 0;
    for (u32 k = begin; k < end; ++k) local += counts[k];
    sums[t] = local;
    __syncthreads();
    // Hillis-Steele inclusive scan over the 1024 chunk sums.
    for (u32 off = 1; off < 1024; off <<= 1) {
        u64 add = (t >= off) ? sums[t - off] : 0;
        __syncthreads();
        sums[t] += add;
        __syncthreads();
    }
    u64 running = sums[t] - local;
    for (u32 k = begin; k < end; ++k) {
        out[k] = running;
        running += counts[k];
    }
    if (t == 1023) out[n] = sums[1023];
}

extern "C" __global__ void nl_fill_bins(const u32* atom_bin, const u64* bin_start, u32* cursor,
                                        u32* bin_atoms, u32 n_atoms) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_atoms) return;
    u32 bin = atom_bin[i];
    u32 slot = atomicAdd(&cursor[bin], 1u);
    bin_atoms[bin_start[bin] + slot] = i;
}

// Sorts each bin's atoms by index, so that the fill order of the atomics
// above cannot change anything downstream.
extern "C" __global__ void nl_sort_bins(const u64* bin_start, u32* bin_atoms, u32 n_bins) {
    u32 b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_bins) return;
    u64 lo = bin_start[b], hi = bin_start[b + 1];
    for (u64 k = lo + 1; k < hi; ++k) {
        u32 v = bin_atoms[k];
        u64 m = k;
        while (m > lo && bin_atoms[m - 1] > v) {
            bin_atoms[m] = bin_atoms[m - 1];
            --m;
        }
        bin_atoms[m] = v;
    }
}

// Visits every neighbour (j, S) of centre i within the cutoff; `emit` gets j and S.
template <typename Emit>
__device__ __forceinline__ void for_each_neighbor(const double* pos, const Geometry& g, const int* wrap,
                                                  const u32* atom_bin, const u64* bin_start,
                                                  const u32* bin_atoms, u32 i, Emit emit) {
    const double ri[3] = {pos[3 * i], pos[3 * i + 1], pos[3 * i + 2]};
    const int wi[3] = {wrap[3 * i], wrap[3 * i + 1], wrap[3 * i + 2]};
    u32 bin = atom_bin[i];
    int bz = (int)(bin % (u32)g.nbins[2]);
    int by = (int)((bin / (u32)g.nbins[2]) % (u32)g.nbins[1]);
    int bx = (int)(bin / ((u32)g.nbins[2] * (u32)g.nbins[1]));
    const int bi[3] = {bx, by, bz};
    int t[3], img[3];
    for (int dx = -g.reach[0]; dx <= g.reach[0]; ++dx) {
        t[0] = bi[0] + dx;
        if (g.pbc[0]) { img[0] = floor_div(t[0], g.nbins[0]); t[0] -= img[0] * g.nbins[0]; }
        else { if (t[0] < 0 || t[0] >= g.nbins[0]) continue; img[0] = 0; }
        for (int dy = -g.reach[1]; dy <= g.reach[1]; ++dy) {
            t[1] = bi[1] + dy;
            if (g.pbc[1]) { img[1] = floor_div(t[1], g.nbins[1]); t[1] -= img[1] * g.nbins[1]; }
            else { if (t[1] < 0 || t[1] >= g.nbins[1]) continue; img[1] = 0; }
            for (int dz = -g.reach[2]; dz <= g.reach[2]; ++dz) {
                t[2] = bi[2] + dz;
                if (g.pbc[2]) { img[2] = floor_div(t[2], g.nbins[2]); t[2] -= img[2] * g.nbins[2]; }
                else { if (t[2] < 0 || t[2] >= g.nbins[2]) continue; img[2] = 0; }
                u32 tb = ((u32)t[0] * (u32)g.nbins[1] + (u32)t[1]) * (u32)g.nbins[2] + (u32)t[2];
                for (u64 slot = bin_start[tb]; slot < bin_start[tb + 1]; ++slot) {
                    u32 j = bin_atoms[slot];
                    // wrapped_j + T·cell − wrapped_i = r_j + (T + w_i − w_j)·cell − r_i.
                    int s[3] = {img[0] + wi[0] - wrap[3 * j], img[1] + wi[1] - wrap[3 * j + 1],
                                img[2] + wi[2] - wrap[3 * j + 2]};
                    if (j == i && s[0] == 0 && s[1] == 0 && s[2] == 0) continue;
                    double sc[3];
                    shift_cartesian(g, s, sc);
                    // pair_vector of the CPU list: r_j + S·cell − r_i, same order.
                    double v0 = pos[3 * j] + sc[0] - ri[0];
                    double v1 = pos[3 * j + 1] + sc[1] - ri[1];
                    double v2 = pos[3 * j + 2] + sc[2] - ri[2];
                    double d2 = v0 * v0 + v1 * v1 + v2 * v2;
                    if (d2 < g.cutoff2) emit(j, s);
                }
            }
        }
    }
}

extern "C" __global__ void nl_count(const double* pos, Geometry g, const int* wrap, const u32* atom_bin,
                                    const u64* bin_start, const u32* bin_atoms, u32* counts) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.n_atoms) return;
    u32 n = 0;
    for_each_neighbor(pos, g, wrap, atom_bin, bin_start, bin_atoms, i, [&](u32, const int*) { ++n; });
    counts[i] = n;
}

__device__ __forceinline__ bool pair_less(u32 ja, const int* sa, u32 jb, const int* sb) {
    if (ja != jb) return ja < jb;
    if (sa[0] != sb[0]) return sa[0] < sb[0];
    if (sa[1] != sb[1]) return sa[1] < sb[1];
    return sa[2] < sb[2];
}

// Writes row i of the CSR list and sorts it by (j, S), the CPU list's order.
extern "C" __global__ void nl_fill(const double* pos, Geometry g, const int* wrap, const u32* atom_bin,
                                   const u64* bin_start, const u32* bin_atoms, const u64* row_start,
                                   u32* neighbors, int* shifts) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.n_atoms) return;
    u64 lo = row_start[i];
    u64 p = lo;
    for_each_neighbor(pos, g, wrap, atom_bin, bin_start, bin_atoms, i, [&](u32 j, const int* s) {
        neighbors[p] = j;
        shifts[3 * p] = s[0];
        shifts[3 * p + 1] = s[1];
        shifts[3 * p + 2] = s[2];
        ++p;
    });
    u64 hi = p;
    for (u64 k = lo + 1; k < hi; ++k) {
        u32 j = neighbors[k];
        int s[3] = {shifts[3 * k], shifts[3 * k + 1], shifts[3 * k + 2]};
        u64 m = k;
        while (m > lo && pair_less(j, s, neighbors[m - 1], &shifts[3 * (m - 1)])) {
            neighbors[m] = neighbors[m - 1];
            shifts[3 * m] = shifts[3 * (m - 1)];
            shifts[3 * m + 1] = shifts[3 * (m - 1) + 1];
            shifts[3 * m + 2] = shifts[3 * (m - 1) + 2];
            --m;
        }
        neighbors[m] = j;
        shifts[3 * m] = s[0];
        shifts[3 * m + 1] = s[1];
        shifts[3 * m + 2] = s[2];
    }
}

// Lennard-Jones parameters: pair energy 4ε[(σ/r)¹² − (σ/r)⁶] − shift.
struct LjParams {
    double four_epsilon;
    double sigma;
    double energy_shift;
};

// One thread per centre: atomic energy ½Σe(r), force Σ e'(r)/r · v and the
// per-atom virial ½Σ e'(r)/r · v⊗v (Voigt xx yy zz yz xz xy), summed over
// the centre's CSR row in row order.
template <typename T>
__device__ void lj_row(const T* pos, const T* basis, const u64* row_start, const u32* neighbors,
                       const int* shifts, LjParams prm, u32 n_atoms, T* atomic, T* forces, T* virial) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_atoms) return;
    const T four_eps = (T)prm.four_epsilon, sigma = (T)prm.sigma, eshift = (T)prm.energy_shift;
    const T ri[3] = {pos[3 * i], pos[3 * i + 1], pos[3 * i + 2]};
    T e = 0, f[3] = {0, 0, 0}, w[6] = {0, 0, 0, 0, 0, 0};
    for (u64 p = row_start[i]; p < row_start[i + 1]; ++p) {
        u32 j = neighbors[p];
        T s0 = (T)shifts[3 * p], s1 = (T)shifts[3 * p + 1], s2 = (T)shifts[3 * p + 2];
        T v[3];
        for (int k = 0; k < 3; ++k) {
            T sc = s0 * basis[k] + s1 * basis[3 + k] + s2 * basis[6 + k];
            v[k] = pos[3 * j + k] + sc - ri[k];
        }
        T r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
        T r = sqrt(r2);
        T sr = sigma / r;
        T sr2 = sr * sr;
        T s6 = sr2 * sr2 * sr2;
        T s12 = s6 * s6;
        e += (T)0.5 * (four_eps * (s12 - s6) - eshift);
        // e'(r)/r = 4ε(−12 s¹² + 6 s⁶)/r².
        T coef = four_eps * ((T)-12 * s12 + (T)6 * s6) / r2;
        for (int k = 0; k < 3; ++k) f[k] += coef * v[k];
        T h = (T)0.5 * coef;
        w[0] += h * v[0] * v[0];
        w[1] += h * v[1] * v[1];
        w[2] += h * v[2] * v[2];
        w[3] += h * v[1] * v[2];
        w[4] += h * v[0] * v[2];
        w[5] += h * v[0] * v[1];
    }
    atomic[i] = e;
    for (int k = 0; k < 3; ++k) forces[3 * i + k] = f[k];
    for (int k = 0; k < 6; ++k) virial[6 * i + k] = w[k];
}

extern "C" __global__ void lj_f64(const double* pos, const double* basis, const u64* row_start,
                                  const u32* neighbors, const int* shifts, LjParams prm, u32 n_atoms,
                                  double* atomic, double* forces, double* virial) {
    lj_row<double>(pos, basis, row_start, neighbors, shifts, prm, n_atoms, atomic, forces, virial);
}

extern "C" __global__ void lj_f32(const float* pos, const float* basis, const u64* row_start,
                                  const u32* neighbors, const int* shifts, LjParams prm, u32 n_atoms,
                                  float* atomic, float* forces, float* virial) {
    lj_row<float>(pos, basis, row_start, neighbors, shifts, prm, n_atoms, atomic, forces, virial);
}

// Column sums of a row-major `n_rows × n_cols` matrix into `out[n_cols]`, in
// f64, by one block of 256 threads per column: thread t sums rows t, t+256,
// …, then a fixed tree. Same bits every run.
template <typename T>
__device__ void column_sums(const T* data, u32 n_rows, u32 n_cols, double* out) {
    __shared__ double part[256];
    u32 c = blockIdx.x, t = threadIdx.x;
    double acc = 0.0;
    for (u32 r = t; r < n_rows; r += 256) acc += (double)data[(u64)r * n_cols + c];
    part[t] = acc;
    __syncthreads();
    for (u32 half = 128; half > 0; half >>= 1) {
        if (t < half) part[t] += part[t + half];
        __syncthreads();
    }
    if (t == 0) out[c] = part[0];
}

extern "C" __global__ void column_sums_f64(const double* data, u32 n_rows, u32 n_cols, double* out) {
    column_sums<double>(data, n_rows, n_cols, out);
}

extern "C" __global__ void column_sums_f32(const float* data, u32 n_rows, u32 n_cols, double* out) {
    column_sums<float>(data, n_rows, n_cols, out);
}

extern "C" __global__ void f64_to_f32(const double* in, float* out, u64 n) {
    u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = (float)in[k];
}
