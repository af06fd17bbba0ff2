// What the model kernels share (prepended to sevennet.cu and schnet.cu when
// they are compiled): integer types and the edge vector.

typedef unsigned int u32;
typedef unsigned long long u64;

// Edge e = (i <- j) of a CSR row: writes the receiver i to centers[e] and
// r_j + S.cell - r_i (f64, the CPU list's order of operations) to v and
// vectors[3e..3e+3].
__device__ __forceinline__ void edge_vector(const double* pos, const double* basis, const int* shifts,
                                            u64 e, u32 i, u32 j, u32* centers, double* vectors,
                                            double v[3]) {
    for (int k = 0; k < 3; ++k) {
        const double sc = (double)shifts[3 * e] * basis[k] + (double)shifts[3 * e + 1] * basis[3 + k] +
                          (double)shifts[3 * e + 2] * basis[6 + k];
        v[k] = pos[3 * j + k] + sc - pos[3 * i + k];
    }
    centers[e] = i;
    for (int k = 0; k < 3; ++k) vectors[3 * e + k] = v[k];
}

