//! candle-core is a heavy dependency (gemm, rayon, zip, tokenizers): it must stay out of the wheel.
//! The wheel is `yoco-py`; it may depend on `yoco-core` only, never on `yoco-ref` or candle.

use std::path::Path;

#[test]
fn candle_stays_out_of_the_wheel() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    // The yoco-py package entry of Cargo.lock lists its resolved dependencies.
    let entry = lock.split("[[package]]").find(|p| p.contains("name = \"yoco-py\"")).expect("yoco-py in Cargo.lock");
    for banned in ["yoco-ref", "candle"] {
        assert!(!entry.contains(banned), "yoco-py depends on {banned}:\n{entry}");
    }
    let core = lock.split("[[package]]").find(|p| p.contains("name = \"yoco-core\"")).expect("yoco-core in Cargo.lock");
    assert!(!core.contains("candle") && !core.contains("yoco-ref"), "yoco-core depends on candle:\n{core}");
}
