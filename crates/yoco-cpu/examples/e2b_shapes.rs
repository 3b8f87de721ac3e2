//! Times the kernel alone at Gemma 3n E2B's projection shapes, 1 and 8 rows, f32 and bf16, one thread
//! (what `benches/e2b_cpu.py` runs): the best of a few calls in thread CPU time, and the linear time of
//! one decode step weighted by how often a step runs each shape. The weights lie in 2 MiB pages where
//! the system grants them (as the executor's: `cpu_linear.py::cpu_weight`), K-major or in panels
//! (`LAYOUT=kmajor|panels`, default panels). The Python twin, `benches/e2b_linear_kernel.py`, adds
//! torch's matmul beside it; this one iterates on the kernel quickly:
//!
//!     [LAYOUT=kmajor] [REPS=3] [ONLY=0,2] cargo run --release --locked -p yoco-cpu --example e2b_shapes [-- ROWS...]

use std::alloc::{alloc_zeroed, dealloc, Layout as Alloc};

use yoco_cpu::{linear_bf16, linear_f32, Layout, LinearError, Mat, MatMut, Weights, PANEL};

/// (N outputs, K inputs, calls per decode step): 30 layers (10 without K/V), the LM head as 4 slices.
const SHAPES: [(usize, usize, usize); 7] = [
    (2048, 2048, 60),
    (512, 2048, 40),
    (8192, 2048, 60),
    (2048, 8192, 30),
    (256, 2048, 30),
    (2048, 256, 30),
    (65600, 2048, 4),
];
/// Row pad of a K-major buffer (as `cpu_linear.py::PAD`).
const PAD: usize = 16;
const HUGE: usize = 1 << 21;

fn cpu_time() -> f64 {
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain syscall writing into `t`.
    unsafe { clock_gettime(3, &mut t) }; // CLOCK_THREAD_CPUTIME_ID
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clk: i32, tp: *mut Timespec) -> i32;
    fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
}

/// A zeroed buffer of `len` elements in 2 MiB pages where the system grants them (`MADV_HUGEPAGE`).
struct Huge<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy> Huge<T> {
    fn new(len: usize) -> Self {
        let bytes = (len * std::mem::size_of::<T>()).next_multiple_of(HUGE);
        let layout = Alloc::from_size_align(bytes, HUGE).unwrap();
        // SAFETY: a non-zero size; the result is checked; madvise only advises.
        unsafe {
            let ptr = alloc_zeroed(layout);
            assert!(!ptr.is_null(), "out of memory");
            madvise(ptr, bytes, 14); // MADV_HUGEPAGE; ignored where THP is off
            Huge {
                ptr: ptr as *mut T,
                len,
            }
        }
    }
    fn slice(&mut self) -> &mut [T] {
        // SAFETY: `len` initialized (zeroed) elements of a live allocation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T> Drop for Huge<T> {
    fn drop(&mut self) {
        let bytes = (self.len * std::mem::size_of::<T>()).next_multiple_of(HUGE);
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            dealloc(
                self.ptr as *mut u8,
                Alloc::from_size_align(bytes, HUGE).unwrap(),
            )
        }
    }
}

/// Synthetic weight `w[j][k]` (any values do: the time does not depend on them).
fn weight(j: usize, k: usize) -> f32 {
    (((j * 7919 + k * 31) % 1000) as f32) * 1e-3 - 0.5
}

/// `n x k` weights as `panels` says, converted by `conv`.
fn weights<T: Copy>(n: usize, k: usize, panels: bool, conv: fn(f32) -> T) -> (Huge<T>, Layout) {
    if panels {
        let ld = PANEL * k;
        let mut buf = Huge::new(n.div_ceil(PANEL) * ld);
        let s = buf.slice();
        for j in 0..n {
            for kk in 0..k {
                s[(j / PANEL) * ld + kk * PANEL + j % PANEL] = conv(weight(j, kk));
            }
        }
        (buf, Layout::Panels { ld })
    } else {
        let ld = n + PAD;
        let mut buf = Huge::new(k * ld);
        let s = buf.slice();
        for kk in 0..k {
            for j in 0..n {
                s[kk * ld + j] = conv(weight(j, kk));
            }
        }
        (buf, Layout::KMajor { ld })
    }
}

type Linear<T> = fn(Mat<T>, Weights<T>, MatMut<T>, usize, usize) -> Result<(), LinearError>;

/// Best of `reps` calls of `lin` at `m` rows (after one warm-up), seconds of thread CPU time.
fn time<T: Copy + Default>(
    lin: Linear<T>,
    w: &Weights<T>,
    m: usize,
    conv: fn(f32) -> T,
    reps: usize,
) -> f64 {
    let k = w.k;
    let x: Vec<T> = (0..m * k)
        .map(|i| conv(((i * 31) % 97) as f32 * 1e-2 - 0.4))
        .collect();
    let mut y = vec![T::default(); m * w.n];
    let mut call = || {
        let x = Mat {
            data: &x,
            rows: m,
            cols: k,
            ld: k,
        };
        let y = MatMut {
            data: &mut y,
            rows: m,
            cols: w.n,
            ld: w.n,
        };
        lin(x, *w, y, 192, 1).unwrap()
    };
    call();
    (0..reps)
        .map(|_| {
            let t = cpu_time();
            call();
            cpu_time() - t
        })
        .fold(f64::INFINITY, f64::min)
}

/// One dtype: a line per shape, then the step's linear time per row count.
fn run<T: Copy + Default>(name: &str, lin: Linear<T>, conv: fn(f32) -> T, rows: &[usize]) {
    let panels = std::env::var("LAYOUT").map_or(true, |v| v != "kmajor");
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!(
        "{name} ({}): ms per call",
        if panels { "panels" } else { "K-major" }
    );
    // ONLY=0,2: just those shapes (by index; the step total then covers only them)
    let only: Option<Vec<usize>> = std::env::var("ONLY").ok().map(|v| {
        v.split(',')
            .map(|i| i.parse().expect("shape indices"))
            .collect()
    });
    let mut step = vec![0.0f64; rows.len()];
    for (i, &(n, k, count)) in SHAPES.iter().enumerate() {
        if only.as_ref().is_some_and(|o| !o.contains(&i)) {
            continue;
        }
        let (mut buf, layout) = weights(n, k, panels, conv);
        let w = Weights {
            data: buf.slice(),
            n,
            k,
            layout,
        };
        let mut line = format!("{n:>6} x {k:>5}:");
        for (ri, &m) in rows.iter().enumerate() {
            let t = time(lin, &w, m, conv, reps);
            step[ri] += t * count as f64;
            line += &format!("  {m} rows {:8.2}", 1e3 * t);
        }
        println!("{line}");
    }
    let parts: Vec<String> = rows
        .iter()
        .zip(&step)
        .map(|(m, t)| format!("{m} rows {:.0} ms", 1e3 * t))
        .collect();
    println!("step linear time: {}\n", parts.join(", "));
}

fn main() {
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("row counts"))
        .collect();
    let rows = if rows.is_empty() { vec![1, 8] } else { rows };
    run::<f32>("f32", linear_f32, |v| v, &rows);
    run::<u16>("bf16", linear_bf16, |v| (v.to_bits() >> 16) as u16, &rows);
}
