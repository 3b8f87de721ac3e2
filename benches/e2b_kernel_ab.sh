#!/usr/bin/env bash
# Interleaved A/B of the CPU linear kernel alone at E2B's shapes (crates/yoco-cpu/examples/e2b_shapes.rs):
# the kernel of a base commit against this working tree's, alternating, several rounds (the shared box is
# noisy: compare within a round). Both binaries run this tree's example (weights in 2 MiB pages, as the
# executor's); a base without the panel layout (before the resident kernel) times K-major weights, which
# is how the executor stored them then.
#
#     benches/e2b_kernel_ab.sh [BASE=main] [ROUNDS=3]        # ROWS="1 8" REPS=3 by default
set -euo pipefail
base=${1:-main}
rounds=${2:-3}
rows=${ROWS:-"1 8"}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

git -C "$root" archive "$base" crates/yoco-cpu | tar -x -C "$tmp"
crate="$tmp/crates/yoco-cpu"
cat > "$crate/Cargo.toml" <<'EOF'
[package]
name = "yoco-cpu"
version = "0.1.0"
edition = "2021"

[profile.release]
debug = "line-tables-only"
EOF
cp "$root/crates/yoco-cpu/examples/e2b_shapes.rs" "$crate/examples/e2b_shapes.rs"
layout_a=panels
if ! grep -q "Panels" "$crate/src/lib.rs"; then
    # the base has no panels: the example's K-major branch only
    sed -i -e 's/Weights, PANEL};/Weights};\nconst PANEL: usize = 16;/' \
        -e 's/(buf, Layout::Panels { ld })/(buf, unreachable!("no panels at the base: {ld}"))/' \
        "$crate/examples/e2b_shapes.rs"
    layout_a=kmajor
fi
(cd "$crate" && CARGO_TARGET_DIR="$tmp/target" cargo build -q --release --example e2b_shapes)
cp "$tmp/target/release/examples/e2b_shapes" "$tmp/a"
(cd "$root" && cargo build -q --release --locked -p yoco-cpu --example e2b_shapes)
cp "$root/target/release/examples/e2b_shapes" "$tmp/b"

echo "A = $base ($layout_a), B = working tree (panels); $(date -u '+%F %H:%M UTC'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
    # shellcheck disable=SC2086
    echo "round $r A: $(LAYOUT=$layout_a "$tmp/a" $rows | grep 'step linear' | tr '\n' ' ')"
    # shellcheck disable=SC2086
    echo "round $r B: $(LAYOUT=panels "$tmp/b" $rows | grep 'step linear' | tr '\n' ' ')"
done
echo "(each line: f32 then bf16); load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
