//! The committed golden fixtures equal what the reference computes now (so kernels are checked
//! against the current reference), and they can be regenerated.

use std::path::PathBuf;

use candle_core::Tensor;
use yoco_ref::golden::{fixtures, write_all};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden")
}

#[test]
fn committed_golden_files_match_the_reference() {
    for f in fixtures().unwrap() {
        let path = dir().join(format!("{}.npz", f.name));
        let stored = Tensor::read_npz(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (regenerate: see golden/README.md)", path.display())
        });
        let mut names: Vec<&str> = stored.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        let mut want: Vec<&str> = f.arrays.iter().map(|(n, _)| n.as_str()).collect();
        want.sort_unstable();
        assert_eq!(names, want, "{}", path.display());
        for (name, t) in &f.arrays {
            let s = &stored.iter().find(|(n, _)| n == name).unwrap().1;
            assert_eq!(s.dims(), t.dims(), "{name}");
            assert_eq!(s.dtype(), t.dtype(), "{name}");
            let (a, b) = (
                s.flatten_all()
                    .unwrap()
                    .to_dtype(candle_core::DType::F64)
                    .unwrap(),
                t.flatten_all()
                    .unwrap()
                    .to_dtype(candle_core::DType::F64)
                    .unwrap(),
            );
            assert_eq!(
                a.to_vec1::<f64>().unwrap(),
                b.to_vec1::<f64>().unwrap(),
                "{} {name} differs from the reference",
                path.display()
            );
        }
    }
}

#[test]
fn golden_files_stay_small() {
    for e in std::fs::read_dir(dir()).unwrap() {
        let e = e.unwrap();
        assert!(
            e.metadata().unwrap().len() < 100_000,
            "{:?} is large",
            e.path()
        );
    }
}

/// `cargo test -p yoco-ref --profile ci --test suite golden:: -- --ignored` rewrites the fixtures.
#[test]
#[ignore]
fn regenerate_golden_files() {
    write_all(&dir()).unwrap();
}
