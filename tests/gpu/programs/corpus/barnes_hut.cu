// A Barnes-Hut-style 2-D n-body step, written like the irregular GPU codes it
// stands for (Burtscher and Pingali's): several kernels share state through
// __device__ variables (the tree's bounding box, the next free cell, an error
// flag, a step counter); the tree is built by all threads at once, each body
// inserted under a spin lock taken with atomicCAS on its child slot, reading
// the child indices through `volatile`; new cells come from a global counter;
// the centres of mass are summarized bottom-up, each cell waiting (spinning) on
// its children; the force kernel walks the tree with an explicit stack. The
// program checks its own result: the root holds the total mass, and the forces
// of a sample of bodies match a direct sum.
//
// The numbering of the cells depends on which thread takes a lock first, so
// build_tree's output is a permutation that can differ between runs (its
// multiset of child entries does not): it verifies under --tolerance auto.
#include "corpus.h"

constexpr int kLocked = -2;
constexpr int kEmpty = -1;
constexpr int kMaxDepth = 48;
constexpr int kStack = 4 * kMaxDepth;

__device__ float d_center_x, d_center_y, d_radius;  // the root cell, from bounding_box
__device__ int d_bottom;                            // the lowest cell index handed out (cells grow downwards)
__device__ int d_error;                             // 1: out of cells, 2: tree too deep
__device__ unsigned d_step;                         // steps integrated so far

__device__ __forceinline__ int quadrant(float px, float py, float cx, float cy) {
    return (px >= cx ? 1 : 0) | (py >= cy ? 2 : 0);
}

// One block: the bounding box of the bodies, the root cell, the cell counter.
__global__ void bounding_box(const float* x, const float* y, int n, int nnodes) {
    __shared__ float lo_x[1024], hi_x[1024], lo_y[1024], hi_y[1024];
    int t = threadIdx.x;
    float a = 1e30f, b = -1e30f, c = 1e30f, d = -1e30f;
    for (int i = t; i < n; i += blockDim.x) {
        a = fminf(a, x[i]); b = fmaxf(b, x[i]);
        c = fminf(c, y[i]); d = fmaxf(d, y[i]);
    }
    lo_x[t] = a; hi_x[t] = b; lo_y[t] = c; hi_y[t] = d;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            lo_x[t] = fminf(lo_x[t], lo_x[t + s]); hi_x[t] = fmaxf(hi_x[t], hi_x[t + s]);
            lo_y[t] = fminf(lo_y[t], lo_y[t + s]); hi_y[t] = fmaxf(hi_y[t], hi_y[t + s]);
        }
        __syncthreads();
    }
    if (t == 0) {
        d_center_x = 0.5f * (lo_x[0] + hi_x[0]);
        d_center_y = 0.5f * (lo_y[0] + hi_y[0]);
        d_radius = 0.5f * fmaxf(hi_x[0] - lo_x[0], hi_y[0] - lo_y[0]) * 1.0001f;
        d_bottom = nnodes;  // the root is cell nnodes; the next one is nnodes - 1
        d_error = 0;
    }
}

// Every cell empty and not yet summarized.
__global__ void clear_cells(int* child, float* mass, int n, int nnodes) {
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < 4 * (nnodes + 1); k += gridDim.x * blockDim.x) {
        child[k] = kEmpty;
        if (k % 4 == 0 && k / 4 >= n) mass[k / 4] = -1.0f;
    }
}

// All bodies inserted at once. A thread that finds its slot empty or holding a
// body locks it (atomicCAS to kLocked), fills it (or splits it into new cells
// until the two bodies part), then publishes the result by writing the slot.
__global__ void build_tree(const float* x, const float* y, volatile int* child, int n, int nnodes) {
    const float rootx = d_center_x, rooty = d_center_y, rootr = d_radius;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float px = x[i], py = y[i];
        bool inserted = false;
        while (!inserted && !*(volatile int*)&d_error) {
            int node = nnodes, depth = 0;
            float cx = rootx, cy = rooty, r = rootr;
            int q = quadrant(px, py, cx, cy);
            int ch = child[4 * node + q];
            while (ch >= n) {  // a cell: go down
                node = ch;
                r *= 0.5f;
                cx += (q & 1) ? r : -r;
                cy += (q & 2) ? r : -r;
                q = quadrant(px, py, cx, cy);
                ch = child[4 * node + q];
                ++depth;
            }
            if (ch == kLocked) continue;  // another thread is splitting this slot: look again
            const int slot = 4 * node + q;
            if (atomicCAS((int*)&child[slot], ch, kLocked) != ch) continue;  // lost the race
            if (ch == kEmpty) {
                child[slot] = i;  // releases the lock
                inserted = true;
                break;
            }
            // The slot holds body ch: new cells until ch and i fall into different quadrants.
            int top = -1, parent = -1, parent_q = 0;
            const float ox = x[ch], oy = y[ch];
            for (;;) {
                const int cell = atomicSub(&d_bottom, 1) - 1;
                if (cell < n) { d_error = 1; break; }
                if (++depth > kMaxDepth) { d_error = 2; break; }
                r *= 0.5f;
                cx += (q & 1) ? r : -r;
                cy += (q & 2) ? r : -r;
                if (top < 0) top = cell; else child[4 * parent + parent_q] = cell;
                const int qo = quadrant(ox, oy, cx, cy), qi = quadrant(px, py, cx, cy);
                if (qo != qi) {
                    child[4 * cell + qo] = ch;
                    child[4 * cell + qi] = i;
                    inserted = true;
                    break;
                }
                parent = cell;
                parent_q = qo;
                q = qo;
            }
            __threadfence();  // the new cells before the slot that makes them reachable
            child[slot] = top >= 0 ? top : ch;
        }
    }
}

// Mass and centre of mass of every cell, from the leaves up: the thread of a
// cell waits until each child cell is summarized (its mass is no longer -1).
__global__ void summarize(volatile const int* child, volatile float* mass, volatile float* cmx, volatile float* cmy, const float* x,
                          const float* y, const float* body_mass, int n, int nnodes) {
    const int bottom = d_bottom;
    for (int cell = bottom + blockIdx.x * blockDim.x + threadIdx.x; cell <= nnodes; cell += gridDim.x * blockDim.x) {
        float m = 0.0f, sx = 0.0f, sy = 0.0f;
        for (int q = 0; q < 4; ++q) {
            const int ch = child[4 * cell + q];
            if (ch == kEmpty) continue;
            float cm, px, py;
            if (ch < n) {
                cm = body_mass[ch]; px = x[ch]; py = y[ch];
            } else {
                while ((cm = mass[ch]) < 0.0f) {}  // not summarized yet
                px = cmx[ch]; py = cmy[ch];
            }
            m += cm; sx += cm * px; sy += cm * py;
        }
        cmx[cell] = sx / m;
        cmy[cell] = sy / m;
        __threadfence();  // the centre before the mass that says it is there
        mass[cell] = m;
    }
}

// The acceleration of every body: cells far enough (size / distance below theta)
// count as their centre of mass, nearer ones are opened; an explicit stack.
__global__ void force(const int* child, const float* mass, const float* cmx, const float* cmy, const float* x,
                      const float* y, const float* body_mass, float* ax, float* ay, int n, int nnodes, float theta) {
    const float eps2 = 1e-6f, rootr = d_radius;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int stack[kStack];
        float size[kStack];
        int top = 0;
        stack[top] = nnodes;
        size[top++] = 2.0f * rootr;
        float fx = 0.0f, fy = 0.0f;
        const float px = x[i], py = y[i];
        while (top > 0) {
            const int node = stack[--top];
            const float s = size[top];
            for (int q = 0; q < 4; ++q) {
                const int ch = child[4 * node + q];
                if (ch == kEmpty || ch == i) continue;
                const bool body = ch < n;
                const float qx = body ? x[ch] : cmx[ch], qy = body ? y[ch] : cmy[ch];
                const float dx = qx - px, dy = qy - py, d2 = dx * dx + dy * dy + eps2;
                if (body || (0.5f * s) * (0.5f * s) < theta * theta * d2) {
                    const float m = body ? body_mass[ch] : mass[ch], inv = rsqrtf(d2);
                    fx += m * dx * inv * inv * inv;
                    fy += m * dy * inv * inv * inv;
                } else if (top < kStack) {
                    stack[top] = ch;
                    size[top++] = 0.5f * s;
                }
            }
        }
        ax[i] = fx;
        ay[i] = fy;
    }
}

__global__ void integrate(float* x, float* y, float* vx, float* vy, const float* ax, const float* ay, int n, float dt) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        vx[i] += dt * ax[i];
        vy[i] += dt * ay[i];
        x[i] += dt * vx[i];
        y[i] += dt * vy[i];
    }
    if (i == 0) atomicAdd(&d_step, 1u);
}

int main() {
    const int n = 4096, nnodes = 3 * n, threads = 256, blocks = n / threads;
    const float theta = 0.5f, dt = 1e-4f;
    std::vector<float> hx = fill(n, 0.0f, 1.0f, 1), hy = fill(n, 0.0f, 1.0f, 2), hm = fill(n, 0.5f, 1.5f, 3);
    float *x = to_device(hx), *y = to_device(hy), *bm = to_device(hm);
    float *vx = to_device(std::vector<float>(n, 0.0f)), *vy = to_device(std::vector<float>(n, 0.0f));
    float *ax = to_device(std::vector<float>(n, 0.0f)), *ay = to_device(std::vector<float>(n, 0.0f));
    int* child;
    float *mass, *cmx, *cmy;
    CHECK(cudaMalloc(&child, 4 * (nnodes + 1) * sizeof(int)));
    CHECK(cudaMalloc(&mass, (nnodes + 1) * sizeof(float)));
    CHECK(cudaMalloc(&cmx, (nnodes + 1) * sizeof(float)));
    CHECK(cudaMalloc(&cmy, (nnodes + 1) * sizeof(float)));

    std::vector<float> first_ax, first_ay;
    float root_mass = 0.0f;
    for (int step = 0; step < 2; ++step) {
        bounding_box<<<1, 1024>>>(x, y, n, nnodes);
        clear_cells<<<64, 256>>>(child, mass, n, nnodes);
        build_tree<<<blocks, threads>>>(x, y, child, n, nnodes);
        summarize<<<blocks, threads>>>(child, mass, cmx, cmy, x, y, bm, n, nnodes);
        force<<<blocks, threads>>>(child, mass, cmx, cmy, x, y, bm, ax, ay, n, nnodes, theta);
        if (step == 0) {
            first_ax = to_host(ax, n);
            first_ay = to_host(ay, n);
            CHECK(cudaMemcpy(&root_mass, mass + nnodes, sizeof(float), cudaMemcpyDeviceToHost));
        }
        integrate<<<blocks, threads>>>(x, y, vx, vy, ax, ay, n, dt);
    }
    int error = 0;
    unsigned steps = 0;
    CHECK(cudaMemcpyFromSymbol(&error, d_error, sizeof error));
    CHECK(cudaMemcpyFromSymbol(&steps, d_step, sizeof steps));

    double total = 0.0;
    for (float m : hm) total += m;
    bool ok = error == 0 && steps == 2 && std::fabs(root_mass - total) < 1e-3 * total;
    float worst = 0.0f;
    for (int i = 0; i < n; i += 64) {  // a sample of bodies against the direct sum
        double fx = 0.0, fy = 0.0, scale = 0.0;  // scale: the sum of the magnitudes, which do not cancel
        for (int j = 0; j < n; ++j) {
            if (j == i) continue;
            double dx = hx[j] - hx[i], dy = hy[j] - hy[i], d2 = dx * dx + dy * dy + 1e-6;
            double inv = 1.0 / std::sqrt(d2);
            fx += hm[j] * dx * inv * inv * inv;
            fy += hm[j] * dy * inv * inv * inv;
            scale += hm[j] / d2;
        }
        worst = std::fmax(worst, (float)(std::hypot(first_ax[i] - fx, first_ay[i] - fy) / scale));
    }
    ok &= worst < 0.02f;  // theta = 0.5: a sequential model of this build gives 0.008
    char what[96];
    std::snprintf(what, sizeof what, "error=%d steps=%u root_mass=%g (want %g) worst force error %.3g", error, steps,
                  root_mass, total, worst);
    return report("barnes_hut", ok, what);
}
