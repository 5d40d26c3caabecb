"""The C source of the kernels of capture/fused.py (built and loaded there): the one-pass statistics, the first values,
the finishing of the statistics, the fingerprints' float64 sums and the sentinels' reductions."""
from __future__ import annotations

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#define LANES 16
#define BLOCK 1024
/* Values ahead of the one being read whose cache line is asked for now: the hardware prefetcher alone kept
   one core at 13-15 GB/s on tensors out of the cache, this at 20-22 GB/s (2 KiB ahead, measured on
   11.2M values against 1, 4 and 8 KiB). A hint only: the arithmetic and so the results are the same. */
#define PREFETCH 512
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif
/* GCC's and clang's vector types, where the compiler has them (GCC 9 on): the loops below over four float64 lanes at a
   time, which GCC did not make of the 16 scalar lanes (float widened to double: it kept scalar adds). Each vector lane
   is one of the 16 lanes of the scalar code, in the same order, so the results are the same to the bit. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 9)
#define VECTORS 1
typedef float f4 __attribute__((vector_size(16)));
typedef double d4 __attribute__((vector_size(32)));
typedef int32_t i4 __attribute__((vector_size(16)));
#endif

/* out[0..6) for one row of n values, shifted by k, the mean of its first (up to) 16 values: the sum
   of (x - k), the sum of (x - k)^2, the sum of |x|, min, max, and k. Shifted sums keep the variance
   E[(x-k)^2] - E[x-k]^2 exact where |mean| is large against the std (BatchNorm weights near 1). */
MULTIVERSION
static void row(const float *x, long n, double *out) {
    double s = 0, q = 0, a = 0, first = 0;
    long m = n < LANES ? n : LANES;
    for (long i = 0; i < m; i++) first += x[i];
    const float k = m > 0 ? (float)(first / m) : 0.0f;
    float mn = INFINITY, mx = -INFINITY;
    for (long i = 0; i < n; i += BLOCK) {
        long end = i + BLOCK < n ? i + BLOCK : n;
        float ls[LANES] = {0}, lq[LANES] = {0}, la[LANES] = {0}, lmn[LANES], lmx[LANES];
        for (int j = 0; j < LANES; j++) { lmn[j] = INFINITY; lmx[j] = -INFINITY; }
        long j = i;
        for (; j + LANES <= end; j += LANES) {
            if (j + PREFETCH < n) __builtin_prefetch(x + j + PREFETCH, 0, 0);
            for (int l = 0; l < LANES; l++) {
                float v = x[j + l], d = v - k;
                ls[l] += d; lq[l] += d * d; la[l] += fabsf(v);
                lmn[l] = v < lmn[l] ? v : lmn[l];
                lmx[l] = v > lmx[l] ? v : lmx[l];
            }
        }
        for (; j < end; j++) {
            float v = x[j], d = v - k;
            ls[0] += d; lq[0] += d * d; la[0] += fabsf(v);
            lmn[0] = v < lmn[0] ? v : lmn[0];
            lmx[0] = v > lmx[0] ? v : lmx[0];
        }
        for (int l = 0; l < LANES; l++) {
            s += ls[l]; q += lq[l]; a += la[l];
            mn = lmn[l] < mn ? lmn[l] : mn;
            mx = lmx[l] > mx ? lmx[l] : mx;
        }
    }
    out[0] = s; out[1] = q; out[2] = a; out[3] = mn; out[4] = mx; out[5] = k;
}

/* x: rows of width values, row r at x + r * stride; out: (6, rows), statistic-major. */
void comgra_row_sums(const float *x, long rows, long width, long stride, double *out) {
    double six[6];
    for (long r = 0; r < rows; r++) {
        row(x + r * stride, width, six);
        for (int k = 0; k < 6; k++) out[k * rows + r] = six[k];
    }
}

/* count tensors of the same number of rows, tensor t at pointers[t] with widths[t] and strides[t];
   out: (count, 6, rows). One call for all the tensors of a step: the fixed cost of a call from
   Python is paid once. */
void comgra_many_row_sums(long count, const int64_t *pointers, long rows, const int64_t *widths,
                          const int64_t *strides, double *out) {
    for (long t = 0; t < count; t++)
        comgra_row_sums((const float *)(uintptr_t)pointers[t], rows, widths[t], strides[t], out + t * 6 * rows);
}

/* The first kept[t] values of each row of each tensor, side by side: out is (rows, total), total the sum of
   kept, tensor t's part at the columns after those of the tensors before it. A copy, so the values are the
   tensors' to the bit. */
void comgra_first_values(long count, const int64_t *pointers, long rows, const int64_t *strides,
                         const int64_t *kept, long total, float *out) {
    long column = 0;
    for (long t = 0; t < count; t++) {
        const float *x = (const float *)(uintptr_t)pointers[t];
        for (long r = 0; r < rows; r++)
            for (long j = 0; j < kept[t]; j++) out[r * total + column + j] = x[r * strides[t] + j];
        column += kept[t];
    }
}

/* The float64 sum and sum of squares of each of count tensors of sizes[t] contiguous float32 values: out (count, 2).
   Every value is widened before it is added (16 lanes of float64 per tensor): the fingerprints of capture/evidence.py,
   as exact as torch's float64 reductions (the order of the additions differs, about 1e-16 relative per value). */
MULTIVERSION
static void wide(const float *x, long n, double *out) {
    double s[16] = {0}, q[16] = {0};
    long i = 0;
#ifdef VECTORS
    d4 vs[4] = {{0}}, vq[4] = {{0}};  /* vs[k][j] is lane 4k + j */
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) {
            f4 f;
            memcpy(&f, x + i + 4 * k, sizeof f);  /* an unaligned load */
            d4 v = __builtin_convertvector(f, d4);
            vs[k] += v; vq[k] += v * v;
        }
    memcpy(s, vs, sizeof s); memcpy(q, vq, sizeof q);
#endif
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) { double v = x[i + l]; s[l] += v; q[l] += v * v; }
    for (; i < n; i++) { double v = x[i]; s[0] += v; q[0] += v * v; }
    double ts = 0, tq = 0;
    for (int l = 0; l < 16; l++) { ts += s[l]; tq += q[l]; }
    out[0] = ts; out[1] = tq;
}

void comgra_wide_sums(long count, const int64_t *pointers, const int64_t *sizes, double *out) {
    for (long t = 0; t < count; t++) wide((const float *)(uintptr_t)pointers[t], sizes[t], out + 2 * t);
}

/* The statistics of count tensors from their sums (count, 6, rows), into out (rows, count, 8) float32 in
   the order of STATISTICS, with the double arithmetic of NumPy's finishing in stats.py, op for op (the
   build turns off contraction into fused multiply-adds, so the results are the same to the bit).
   flags[t] = 1 where a row of tensor t needs the exact path there: a sum of |x| that is not finite (NaN or
   inf to count), or a variance that cancels. Such a tensor's part of out is left for the caller. */
void comgra_finish(long count, long rows, const double *widths, const double *sums, float *out, int8_t *flags) {
    for (long t = 0; t < count; t++) {
        const double *s = sums + t * 6 * rows, n = widths[t];
        int8_t flag = 0;
        for (long r = 0; r < rows; r++) {
            double shifted = s[r] / n, variance = s[rows + r] / n - shifted * shifted;
            if (!isfinite(s[2 * rows + r]) || !isfinite(variance) || !(variance * 3 >= shifted * shifted)) flag = 1;
        }
        flags[t] = flag;
        if (flag) continue;
        for (long r = 0; r < rows; r++) {
            double shifted = s[r] / n, variance = s[rows + r] / n - shifted * shifted;
            double minimum = s[3 * rows + r], maximum = s[4 * rows + r];
            float *o = out + (r * count + t) * 8;
            o[0] = (float)(s[5 * rows + r] + shifted);
            o[1] = (float)(s[2 * rows + r] / n);
            o[2] = (float)sqrt(variance > 0.0 ? variance : 0.0);
            o[3] = (float)minimum;
            o[4] = (float)maximum;
            o[5] = (float)(-minimum > maximum ? -minimum : maximum);
            o[6] = 0.0f;
            o[7] = 0.0f;
        }
    }
}
/* The sentinels' reductions (breakpoints/sentinels.py) of n contiguous values of one type (kind: 0 float32,
   1 float64, 2 int64, 3 int32, 4 uint8 or bool, 5 int8, 6 int16) into out[0..3): the minimum, the maximum and the
   sum of squares in float64. As torch.aminmax, a NaN anywhere makes the minimum and the maximum NaN. One call for
   what took torch seven (a cast, aminmax, vector_norm, three reads), each 5-20 us of dispatch in a training loop.
   Floats in 16 lanes (vectorised: no test per value; a NaN shows in the sum of squares, which only a NaN makes
   NaN, the squares being >= 0), integers one at a time. */
#define EXTREMES(T) { const T *v = (const T *)x; double q = 0; T mn = v[0], mx = v[0]; \
    for (long i = 0; i < n; i++) { T e = v[i]; mn = e < mn ? e : mn; mx = e > mx ? e : mx; \
                                   q += (double)e * (double)e; } \
    out[0] = (double)mn; out[1] = (double)mx; out[2] = q; }
/* VECTOR_PART: a first loop over the same lanes (see FLOAT_VECTORS), or nothing; the scalar loop takes what it left. */
#define EXTREMES_LANES(T, VECTOR_PART) { const T *v = (const T *)x; T mn[16], mx[16]; double q[16]; long i = 0; \
    for (int l = 0; l < 16; l++) { mn[l] = INFINITY; mx[l] = -INFINITY; q[l] = 0; } \
    VECTOR_PART \
    for (; i + 16 <= n; i += 16) \
        for (int l = 0; l < 16; l++) { T e = v[i + l]; mn[l] = e < mn[l] ? e : mn[l]; mx[l] = e > mx[l] ? e : mx[l]; \
                                       q[l] += (double)e * (double)e; } \
    for (; i < n; i++) { T e = v[i]; mn[0] = e < mn[0] ? e : mn[0]; mx[0] = e > mx[0] ? e : mx[0]; \
                         q[0] += (double)e * (double)e; } \
    double s = 0; T lo = mn[0], hi = mx[0]; \
    for (int l = 0; l < 16; l++) { s += q[l]; lo = mn[l] < lo ? mn[l] : lo; hi = mx[l] > hi ? mx[l] : hi; } \
    out[0] = s != s ? NAN : (double)lo; out[1] = s != s ? NAN : (double)hi; out[2] = s; }
/* Floats' lanes in vector types where there are: a comparison gives -1 in the lanes where it holds (never for a NaN,
   as in e < mn ? e : mn), and the lanes then take the new value or keep the old one by bits. */
#ifdef VECTORS
#define FLOAT_VECTORS { f4 vmn[4], vmx[4]; d4 vq[4] = {{0}}; \
    for (int k = 0; k < 4; k++) { vmn[k] = (f4){INFINITY, INFINITY, INFINITY, INFINITY}; vmx[k] = -vmn[k]; } \
    for (; i + 16 <= n; i += 16) \
        for (int k = 0; k < 4; k++) { \
            f4 e; \
            memcpy(&e, v + i + 4 * k, sizeof e); \
            i4 lower = e < vmn[k], higher = e > vmx[k]; \
            vmn[k] = (f4)(((i4)e & lower) | ((i4)vmn[k] & ~lower)); \
            vmx[k] = (f4)(((i4)e & higher) | ((i4)vmx[k] & ~higher)); \
            d4 w = __builtin_convertvector(e, d4); \
            vq[k] += w * w; \
        } \
    memcpy(mn, vmn, sizeof mn); memcpy(mx, vmx, sizeof mx); memcpy(q, vq, sizeof q); }
#else
#define FLOAT_VECTORS
#endif
MULTIVERSION
static void extremes_float(const void *x, long n, double *out) EXTREMES_LANES(float, FLOAT_VECTORS)
MULTIVERSION
static void extremes_double(const void *x, long n, double *out) EXTREMES_LANES(double, )
void comgra_extremes(const void *x, long n, int kind, double *out) {
    if (n <= 0) { out[0] = out[1] = out[2] = NAN; return; }
    switch (kind) {
        case 0: extremes_float(x, n, out); break;
        case 1: extremes_double(x, n, out); break;
        case 2: EXTREMES(int64_t) break;
        case 3: EXTREMES(int32_t) break;
        case 4: EXTREMES(uint8_t) break;
        case 5: EXTREMES(int8_t) break;
        case 6: EXTREMES(int16_t) break;
        default: out[0] = out[1] = out[2] = NAN;
    }
}

/* comgra_extremes of count tensors in one call, tensor t described by specs[3t..3t+3): its address, its number of
   values and its kind; out (count, 3). The sentinels of a training step, gathered at its end. */
void comgra_many_extremes(long count, const int64_t *specs, double *out) {
    for (long t = 0; t < count; t++)
        comgra_extremes((const void *)(uintptr_t)specs[3 * t], specs[3 * t + 1], (int)specs[3 * t + 2], out + 3 * t);
}
"""
