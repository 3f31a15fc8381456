// A level-scheduled sparse lower-triangular solve, L x = b, in place (x holds b on entry),
// without a barrier between levels: one thread per row, each spinning on its row's
// dependency counter (how many of the rows it reads are not solved yet) until it reaches
// zero; a solved row decrements the counters of the rows that read it. Rows are taken in
// level order from an atomic ticket, so a row only ever waits on rows already taken by
// running threads (no deadlock, whatever the grid). The last thread out resets the ticket
// for the next solve; the dependency counters are the application's to re-arm (it copies
// the in-degrees before each solve).
//
// A second launch without that re-arming finds every counter at zero: rows start without
// waiting for their predecessors and read b where the first launch left x (wrong values),
// and the first decrement of a counter whose row has not looked yet wraps it below zero,
// to 0xffffffff: that row, and every row after it, spins forever.
#include "common.h"

__global__ void trisolve(const int* row_ptr, const int* cols, const double* vals, const double* diag,
                         const int* succ_ptr, const int* succ, const int* order, int rows, double* x,
                         unsigned* remaining, unsigned* counters) {
    const unsigned t = atomicAdd(&counters[0], 1u);
    if (t < static_cast<unsigned>(rows)) {
        const int i = order[t];
        while (load_acquire(&remaining[i]) != 0u) __nanosleep(64);
        double s = x[i];
        for (int k = row_ptr[i]; k < row_ptr[i + 1]; ++k) s -= vals[k] * x[cols[k]];
        x[i] = s / diag[i];
        for (int k = succ_ptr[i]; k < succ_ptr[i + 1]; ++k)
            device_ref(remaining[succ[k]]).fetch_sub(1u, cuda::memory_order_release);
    }
    if (last_thread_out(&counters[1])) {  // every ticket is taken: the next solve starts from row 0
        counters[0] = 0;
        counters[1] = 0;
    }
}

int main() {
    const int rows = 16384, gap = 32, window = 256;
    // Row i reads 1..6 rows among [i - window, i - gap) (the first rows read none), weights summing to at most
    // 1/4 of a diagonal of at least 1: x stays as large as b.
    std::vector<int> row_ptr{0}, cols;
    std::vector<double> vals, diag(rows);
    Lcg rng{7};
    for (int i = 0; i < rows; ++i) {
        std::vector<int> mine;
        if (i > gap) {
            const int lo = i - window < 0 ? 0 : i - window, span = i - gap - lo;
            for (int d = 1 + static_cast<int>(rng.below(6)); d > 0; --d)
                mine.push_back(lo + static_cast<int>(rng.below(span)));
            std::sort(mine.begin(), mine.end());
            mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
        }
        for (int j : mine) {
            cols.push_back(j);
            vals.push_back((static_cast<int>(rng.below(2001)) - 1000) / (4000.0 * mine.size()));
        }
        row_ptr.push_back(static_cast<int>(cols.size()));
        diag[i] = 1.0 + rng.below(1000) / 1000.0;
    }
    // Levels, the level order, the rows reading each row (successors), the in-degrees.
    std::vector<int> level(rows, 0), order(rows), indeg(rows);
    std::vector<std::vector<int>> readers(rows);
    for (int i = 0; i < rows; ++i) {
        indeg[i] = row_ptr[i + 1] - row_ptr[i];
        for (int k = row_ptr[i]; k < row_ptr[i + 1]; ++k) {
            level[i] = std::max(level[i], level[cols[k]] + 1);
            readers[cols[k]].push_back(i);
        }
        order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return level[a] < level[b]; });
    std::vector<int> succ_ptr{0}, succ;
    for (const auto& r : readers) {
        succ.insert(succ.end(), r.begin(), r.end());
        succ_ptr.push_back(static_cast<int>(succ.size()));
    }
    std::vector<double> b(rows);
    for (double& v : b) v = (static_cast<int>(rng.below(2001)) - 1000) / 100.0;

    int* d_row_ptr = to_device(row_ptr);
    int* d_cols = to_device(cols);
    double* d_vals = to_device(vals);
    double* d_diag = to_device(diag);
    int* d_succ_ptr = to_device(succ_ptr);
    int* d_succ = to_device(succ);
    int* d_order = to_device(order);
    double* x = to_device(b);
    unsigned* remaining = to_device(std::vector<unsigned>(indeg.begin(), indeg.end()));
    unsigned* counters = to_device(std::vector<unsigned>(2, 0u));

    const int threads = 128;
    trisolve<<<(rows + threads - 1) / threads, threads>>>(d_row_ptr, d_cols, d_vals, d_diag, d_succ_ptr, d_succ,
                                                         d_order, rows, x, remaining, counters);
    CHECK(cudaGetLastError());

    std::vector<double> got = to_host(x, rows), want(rows);
    std::vector<unsigned> left = to_host(remaining, rows), c = to_host(counters, 2);
    bool ok = c[0] == 0 && c[1] == 0;
    for (int i = 0; i < rows; ++i) {
        double s = b[i];
        for (int k = row_ptr[i]; k < row_ptr[i + 1]; ++k) s -= vals[k] * want[cols[k]];
        want[i] = s / diag[i];
        ok &= std::fabs(got[i] - want[i]) <= 1e-9 * (1.0 + std::fabs(want[i])) && left[i] == 0;
    }
    return report("trisolve_levels", ok, "x, a dependency counter or the ticket differs");
}
