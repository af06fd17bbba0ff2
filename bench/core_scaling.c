/* How fast one core runs while the other cores are busy: the ceiling of any
 * decomposed run on a machine. Time N copies at once and compare with one.
 *
 *   mode 0: eight independent multiply-add chains (core throughput, no memory
 *           traffic); the argument is the iteration count, e.g. 400000000.
 *   mode 1: streaming sums over a 256 MiB array (memory bandwidth); the
 *           argument is the pass count, e.g. 40.
 *
 * Build: gcc -O2 -o core_scaling core_scaling.c
 * Run:   for k in $(seq 1 16); do ./core_scaling 0 400000000 & done; wait
 * Each copy prints its seconds (and a checksum, so the work is not elided).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODE COUNT\n", argv[0]);
        return 2;
    }
    int mode = atoi(argv[1]);
    long n = atol(argv[2]);
    double t0 = now(), checksum = 0;
    if (mode == 0) {
        double a[8] = {1, 1, 1, 1, 1, 1, 1, 1}, y = 1.0000001;
        for (long i = 0; i < n; i++)
            for (int k = 0; k < 8; k++) a[k] = a[k] * y + 1e-9;
        for (int k = 0; k < 8; k++) checksum += a[k];
    } else {
        long m = 1L << 25;
        double *x = malloc(m * sizeof(double));
        if (!x) return 2;
        for (long i = 0; i < m; i++) x[i] = (double)i;
        t0 = now();
        for (long r = 0; r < n; r++) {
            double q[8] = {0};
            for (long i = 0; i < m; i += 8)
                for (int k = 0; k < 8; k++) q[k] += x[i + k];
            for (int k = 0; k < 8; k++) checksum += q[k];
        }
        free(x);
    }
    printf("%.4f %g\n", now() - t0, checksum);
    return 0;
}
