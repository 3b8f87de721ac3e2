//! Tells tests whether they run optimized (`cfg(yoco_optimized)`), so the randomized invariant test
//! can run its full million operations under `--profile ci` / `--release` and a lighter load in an
//! unoptimized `cargo test`.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(yoco_optimized)");
    if std::env::var("OPT_LEVEL").is_ok_and(|o| o != "0") {
        println!("cargo::rustc-cfg=yoco_optimized");
    }
    println!("cargo::rerun-if-changed=build.rs");
}
