//! Times the kernel alone on K-major weights at Gemma 3n E2B's projection shapes, 1 and 8 rows, f32 and
//! bf16, one thread (what `benches/e2b_cpu.py` runs): the best of a few calls in thread CPU time, and the
//! linear time of one decode step weighted by how often a step runs each shape. The Python twin,
//! `benches/e2b_linear_kernel.py`, adds torch's matmul beside it; this one iterates on the kernel quickly:
//!
//!     cargo run --release --locked -p yoco-cpu --example e2b_shapes [-- ROWS...]

use yoco_cpu::{linear_bf16, linear_f32, Layout, Mat, MatMut, Weights};

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
const PAD: usize = 16;

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
}

fn best(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = cpu_time();
            f();
            cpu_time() - t
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("row counts"))
        .collect();
    let rows = if rows.is_empty() { vec![1, 8] } else { rows };
    for bf16 in [false, true] {
        let mut step = vec![0.0f64; rows.len()];
        println!("{}: ms per call", if bf16 { "bf16" } else { "f32" });
        for &(n, k, count) in &SHAPES {
            let ld = n + PAD;
            let mut line = format!("{n:>6} x {k:>5}:");
            let wf: Vec<f32> = (0..k * ld)
                .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
                .collect();
            let wb: Vec<u16> = wf.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            for (ri, &m) in rows.iter().enumerate() {
                let x: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 31) % 97) as f32 * 1e-2 - 0.4)
                    .collect();
                let xb: Vec<u16> = x.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                let reps: usize = std::env::var("REPS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(3);
                let t = if bf16 {
                    let mut y = vec![0u16; m * n];
                    best(
                        || {
                            linear_bf16(
                                Mat {
                                    data: &xb,
                                    rows: m,
                                    cols: k,
                                    ld: k,
                                },
                                Weights {
                                    data: &wb,
                                    n,
                                    k,
                                    layout: Layout::KMajor { ld },
                                },
                                MatMut {
                                    data: &mut y,
                                    rows: m,
                                    cols: n,
                                    ld: n,
                                },
                                192,
                                1,
                            )
                            .unwrap()
                        },
                        reps,
                    )
                } else {
                    let mut y = vec![0f32; m * n];
                    best(
                        || {
                            linear_f32(
                                Mat {
                                    data: &x,
                                    rows: m,
                                    cols: k,
                                    ld: k,
                                },
                                Weights {
                                    data: &wf,
                                    n,
                                    k,
                                    layout: Layout::KMajor { ld },
                                },
                                MatMut {
                                    data: &mut y,
                                    rows: m,
                                    cols: n,
                                    ld: n,
                                },
                                192,
                                1,
                            )
                            .unwrap()
                        },
                        reps,
                    )
                };
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
}
