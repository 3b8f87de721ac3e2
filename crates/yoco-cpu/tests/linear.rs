//! The AVX2 kernels against the scalar specification, bit for bit, over shapes that hit every tile,
//! panel edge, block remainder and both weight layouts; and the property the executor needs: a row's
//! outputs do not depend on the other rows, the row count, the kernel or the thread count. Every call
//! on panels runs with the AVX-512 tiles off and on (where the CPU has them) and must agree bit for bit.

use std::sync::Mutex;

use rand::{Rng, SeedableRng};
use yoco_cpu::{
    available, avx512_available, linear_bf16, linear_f32, reference, set_avx512, Layout, Mat,
    MatMut, Weights, PANEL,
};

/// Serializes the tests' switching of the process-wide AVX-512 setting.
static WIDTH: Mutex<()> = Mutex::new(());

/// `call()` on panels with the AVX2 tiles, then the AVX-512 ones where the CPU has them: the two
/// must agree bit for bit (the AVX-512 result is returned); other layouts run once.
fn both_widths<R: PartialEq + std::fmt::Debug>(layout: Layout, call: impl Fn() -> R) -> R {
    if !matches!(layout, Layout::Panels { .. }) {
        return call();
    }
    let _guard = WIDTH.lock().unwrap_or_else(|e| e.into_inner());
    set_avx512(false);
    let narrow = call();
    if !set_avx512(true) {
        return narrow;
    }
    let wide = call();
    assert!(
        narrow == wide,
        "AVX2 and AVX-512 tiles differ on {layout:?}"
    );
    wide
}

#[test]
fn the_avx512_tiles_are_exercised_where_the_cpu_has_them() {
    // guards the test above against silently running one path only
    let _guard = WIDTH.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(set_avx512(true), avx512_available());
    assert!(!set_avx512(false));
    set_avx512(true);
}

fn randn(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

/// `w` (row-major, contiguous) as K-major data: `wt[k][j] = w[j][k]`.
fn k_major<T: Copy>(w: &[T], n: usize, k: usize) -> Vec<T> {
    (0..k)
        .flat_map(|kk| (0..n).map(move |j| w[j * k + kk]))
        .collect()
}

/// `w` (row-major, contiguous) in panels of `PANEL` columns, `ld` apart, the last one padded with `pad`.
fn panels<T: Copy>(w: &[T], n: usize, k: usize, ld: usize, pad: T) -> Vec<T> {
    let mut out = vec![pad; n.div_ceil(PANEL) * ld];
    for j in 0..n {
        for kk in 0..k {
            out[(j / PANEL) * ld + kk * PANEL + j % PANEL] = w[j * k + kk];
        }
    }
    out
}

fn layouts<T: Copy + Default>(w: &[T], n: usize, k: usize) -> [(Vec<T>, Layout); 3] {
    // panels a little further apart than they need be (any stride >= PANEL * k is valid)
    let ld = PANEL * k + 8;
    [
        (w.to_vec(), Layout::RowMajor { ld: k }),
        (k_major(w, n, k), Layout::KMajor { ld: n }),
        (panels(w, n, k, ld, T::default()), Layout::Panels { ld }),
    ]
}

#[allow(clippy::too_many_arguments)]
fn run_f32(
    x: &[f32],
    w: &[f32],
    layout: Layout,
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
    threads: usize,
) -> Vec<f32> {
    // compared as bits: NaN == NaN, -0 != +0
    both_widths(layout, || run_f32_once(x, w, layout, m, n, k, kc, threads))
        .into_iter()
        .map(f32::from_bits)
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn run_f32_once(
    x: &[f32],
    w: &[f32],
    layout: Layout,
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
    threads: usize,
) -> Vec<u32> {
    let mut y = vec![f32::NAN; m * n];
    linear_f32(
        Mat {
            data: x,
            rows: m,
            cols: k,
            ld: k,
        },
        Weights {
            data: w,
            n,
            k,
            layout,
        },
        MatMut {
            data: &mut y,
            rows: m,
            cols: n,
            ld: n,
        },
        kc,
        threads,
    )
    .unwrap();
    y.iter().map(|v| v.to_bits()).collect()
}

fn run_bf16(
    x: &[u16],
    w: &[u16],
    layout: Layout,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
) -> Vec<u16> {
    both_widths(layout, || run_bf16_once(x, w, layout, m, n, k, threads))
}

fn run_bf16_once(
    x: &[u16],
    w: &[u16],
    layout: Layout,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
) -> Vec<u16> {
    let mut y = vec![0u16; m * n];
    linear_bf16(
        Mat {
            data: x,
            rows: m,
            cols: k,
            ld: k,
        },
        Weights {
            data: w,
            n,
            k,
            layout,
        },
        MatMut {
            data: &mut y,
            rows: m,
            cols: n,
            ld: n,
        },
        192,
        threads,
    )
    .unwrap();
    y
}

/// True (and says so on stderr) where this CPU lacks AVX2/FMA: the kernels cannot run, the executor
/// pads its GEMMs in torch instead, and only the refusal is tested here.
fn skip_without_kernel() -> bool {
    if available() {
        return false;
    }
    eprintln!("skipped: this CPU lacks AVX2/FMA, the CPU linear kernel is unavailable");
    true
}

#[test]
fn f32_kernels_equal_the_scalar_order_bit_for_bit() {
    if skip_without_kernel() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for &(m, n, k, kc) in &[
        (1, 64, 192, 192),
        (1, 70, 2048, 192),
        (1, 1100, 300, 192),
        (2, 50, 300, 192),
        (3, 33, 257, 128),
        (4, 24, 200, 192),
        (4, 2051, 70, 192),
        (5, 17, 1000, 192),
        (6, 16, 64, 192),
        (7, 40, 389, 192),
        (13, 100, 515, 192),
        (9, 48, 400, 192),
        (12, 80, 385, 192),
        (16, 33, 200, 64),
        (17, 130, 193, 192),
        (8, 8200, 400, 192),
        (1, 9, 5, 192),
        (8, 3, 4, 192),
        (3, 300, 2048, 2048),
        (2, 8, 1, 1),
    ] {
        let x = randn(&mut rng, m * k);
        let w = randn(&mut rng, n * k);
        let want = reference::linear_f32(&x, &w, m, n, k, kc);
        for (data, layout) in layouts(&w, n, k) {
            for threads in [1, 3] {
                let got = run_f32(&x, &data, layout, m, n, k, kc, threads);
                let bad = got
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    bad.is_none(),
                    "m={m} n={n} k={k} kc={kc} {layout:?} threads={threads}: mismatch at {bad:?}"
                );
            }
        }
    }
}

#[test]
fn bf16_kernels_are_the_f32_order_on_widened_values_rounded_once() {
    if skip_without_kernel() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for &(m, n, k) in &[
        (1, 70, 2048),
        (2, 30, 300),
        (3, 9, 777),
        (4, 1030, 100),
        (11, 45, 2048),
    ] {
        let x: Vec<u16> = randn(&mut rng, m * k)
            .into_iter()
            .map(reference::f32_to_bf16)
            .collect();
        let w: Vec<u16> = randn(&mut rng, n * k)
            .into_iter()
            .map(reference::f32_to_bf16)
            .collect();
        let want = reference::linear_bf16(&x, &w, m, n, k, 192);
        for (data, layout) in layouts(&w, n, k) {
            assert_eq!(
                run_bf16(&x, &data, layout, m, n, k, 2),
                want,
                "{m} {n} {k} {layout:?}"
            );
        }
    }
}

#[test]
fn a_rows_outputs_do_not_depend_on_the_other_rows_the_kernel_or_the_thread_count() {
    if skip_without_kernel() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (n, k) = (200, 2048);
    let w = randn(&mut rng, n * k);
    let x = randn(&mut rng, 40 * k);
    let all = run_f32(&x, &w, Layout::RowMajor { ld: k }, 40, n, k, 192, 1);
    for (data, layout) in layouts(&w, n, k) {
        for m in [1, 2, 3, 4, 5, 8, 17, 40] {
            for threads in [1, 2] {
                let part = run_f32(&x[..m * k], &data, layout, m, n, k, 192, threads);
                assert_eq!(part, all[..m * n], "{layout:?} m={m} threads={threads}");
            }
        }
    }
}

#[test]
fn strided_rows_and_columns_of_wider_buffers() {
    if skip_without_kernel() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let (n, k) = (20, 100);
    let (ldx, ldy) = (130, 25);
    for m in [3, 6] {
        let x = randn(&mut rng, (m - 1) * ldx + k);
        let w = randn(&mut rng, n * k);
        let xs: Vec<f32> = (0..m)
            .flat_map(|i| x[i * ldx..i * ldx + k].to_vec())
            .collect();
        let want = reference::linear_f32(&xs, &w, m, n, k, 192);
        // row-major with row stride 101, K-major with stride 23: both views of wider buffers
        let wr: Vec<f32> = (0..n)
            .flat_map(|j| w[j * k..(j + 1) * k].iter().copied().chain([9.0]))
            .collect();
        let wk: Vec<f32> = (0..k)
            .flat_map(|kk| {
                (0..n)
                    .map(|j| w[j * k + kk])
                    .chain([9.0; 3])
                    .collect::<Vec<_>>()
            })
            .collect();
        // panels 5 elements further apart than they need be, the last one's 12 pad columns 9.0 too
        let wp = panels(&w, n, k, PANEL * k + 5, 9.0);
        for (data, layout) in [
            (wr, Layout::RowMajor { ld: k + 1 }),
            (wk, Layout::KMajor { ld: n + 3 }),
            (wp, Layout::Panels { ld: PANEL * k + 5 }),
        ] {
            let mut y = vec![-7.0f32; (m - 1) * ldy + n + 5];
            linear_f32(
                Mat {
                    data: &x,
                    rows: m,
                    cols: k,
                    ld: ldx,
                },
                Weights {
                    data: &data,
                    n,
                    k,
                    layout,
                },
                MatMut {
                    data: &mut y,
                    rows: m,
                    cols: n,
                    ld: ldy,
                },
                192,
                1,
            )
            .unwrap();
            for i in 0..m {
                assert_eq!(
                    y[i * ldy..i * ldy + n],
                    want[i * n..(i + 1) * n],
                    "{layout:?} row {i}"
                );
                let gap = if i + 1 < m {
                    &y[i * ldy + n..(i + 1) * ldy]
                } else {
                    &y[i * ldy + n..]
                };
                assert!(
                    gap.iter().all(|&v| v == -7.0),
                    "{layout:?}: wrote outside row {i}"
                );
            }
        }
    }
}

#[test]
fn shapes_that_do_not_line_up_are_errors_not_reads_out_of_bounds() {
    let x = vec![0f32; 10];
    let w = vec![0f32; 12];
    let mut y = vec![0f32; 6];
    let mut call = |xr: usize, xc: usize, wn: usize, layout: Layout, yc: usize, kc: usize| {
        linear_f32(
            Mat {
                data: &x,
                rows: xr,
                cols: xc,
                ld: xc,
            },
            Weights {
                data: &w,
                n: wn,
                k: xc,
                layout,
            },
            MatMut {
                data: &mut y,
                rows: xr,
                cols: yc,
                ld: yc,
            },
            kc,
            1,
        )
    };
    assert!(call(2, 6, 2, Layout::RowMajor { ld: 6 }, 2, 192).is_err()); // x needs 12 elements
    assert!(call(2, 5, 3, Layout::RowMajor { ld: 5 }, 3, 192).is_err()); // w needs 15
    assert!(call(2, 5, 3, Layout::KMajor { ld: 3 }, 3, 192).is_err()); // w needs 15 as well
    assert!(call(2, 5, 2, Layout::KMajor { ld: 1 }, 2, 192).is_err()); // stride below N
    assert!(call(2, 5, 3, Layout::Panels { ld: 80 }, 3, 192).is_err()); // a 16 x 5 panel needs 80
    assert!(call(2, 5, 2, Layout::RowMajor { ld: 5 }, 3, 192).is_err()); // y is 2 x 3, w has 2 outputs
    assert!(call(2, 5, 2, Layout::RowMajor { ld: 5 }, 2, 0).is_err()); // kc 0
    if available() {
        assert!(call(2, 5, 2, Layout::RowMajor { ld: 5 }, 2, 192).is_ok());
        assert!(call(2, 5, 2, Layout::KMajor { ld: 2 }, 2, 192).is_ok());
    } else {
        // no AVX2/FMA: well-formed operands are refused with a clear error, never run
        let err = call(2, 5, 2, Layout::RowMajor { ld: 5 }, 2, 192).unwrap_err();
        assert_eq!(err, yoco_cpu::LinearError::Unavailable);
        assert!(err.to_string().contains("AVX2 and FMA"));
    }
}
