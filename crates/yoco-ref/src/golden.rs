//! Golden fixtures for the Python and Triton kernels: inputs and the reference's expected outputs
//! for a mixed paged batch, written as `.npz` (numpy's `np.load`). The format is documented in
//! `golden/README.md`; `tests/suite/golden.rs` checks the committed files against a fresh computation and
//! regenerates them on request (`cargo test -p yoco-ref --profile ci --test suite golden:: -- --ignored`).

use std::path::Path;

use candle_core::{Device, Tensor};
use yoco_core::kv::CopyOp;

use crate::attention::Heads;
use crate::batch::{contiguous_attention, paged_attention, Varlen};
use crate::error::Result;
use crate::paged::{Fill, KvGeometry, PagedKv};
use crate::rng::Rng;

/// Head layout of the fixtures: GQA with 2 query heads per kv head, as the kernels must handle.
pub const HEADS: Heads = Heads {
    num_heads: 4,
    kv_heads: 2,
    head_dim: 16,
};
/// Block size of the fixtures' paged memory (the kernels' usual block size).
pub const BLOCK_SIZE: usize = 16;
/// Windows the attention outputs are given for (0 = full causal).
pub const WINDOWS: [u32; 3] = [0, 5, 21];

/// One fixture file: named arrays.
pub struct Fixture {
    /// File stem: the fixture is written as `<name>.npz`.
    pub name: &'static str,
    /// The arrays, named as `golden/README.md` documents them, inputs and expected outputs.
    pub arrays: Vec<(String, Tensor)>,
}

fn f32s(v: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}

fn i32s(v: Vec<i32>, shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
}

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.sym_f32()).collect()
}

/// A row of the mixed batch: tokens computed before the step, tokens scheduled, cross rows.
struct Row {
    computed: usize,
    scheduled: usize,
    cross: usize,
    blocks: Vec<i32>,
}

/// The mixed batch: a prefill from 0, a middle chunk crossing a block boundary (with two cross
/// rows, as a prompt-logprobs request has), and two decodes, one of them at the first slot of a
/// block; block ids shuffled; 3 padding tokens writing into block 0; 3 padding cross rows.
fn rows() -> Vec<Row> {
    vec![
        Row {
            computed: 0,
            scheduled: 9,
            cross: 1,
            blocks: vec![7],
        },
        Row {
            computed: 14,
            scheduled: 6,
            cross: 2,
            blocks: vec![3, 8],
        },
        Row {
            computed: 36,
            scheduled: 1,
            cross: 1,
            blocks: vec![5, 1, 9],
        },
        Row {
            computed: 16,
            scheduled: 1,
            cross: 1,
            blocks: vec![2, 6],
        },
    ]
}

const NUM_BLOCKS: usize = 10;
const MAX_BLOCKS: usize = 3;
const TOKENS_PADDED: usize = 20;
const CROSS_PADDED: usize = 8;

/// `paged_attention.npz` and `write_and_copy.npz`.
pub fn fixtures() -> Result<Vec<Fixture>> {
    Ok(vec![paged_attention_fixture()?, write_and_copy()?])
}

fn paged_attention_fixture() -> Result<Fixture> {
    let h = HEADS;
    let (kvl, ql) = (h.kv_len(), h.q_len());
    let mut rng = Rng::new(2024);
    let geo = KvGeometry {
        block_size: BLOCK_SIZE,
        kv_heads: h.kv_heads,
        head_dim: h.head_dim,
    };
    let mut kv = PagedKv::new(geo, &[NUM_BLOCKS], &[1], Fill::Random(99))?;
    let rows = rows();
    let mut slot_mapping = Vec::new();
    let mut block_tables = vec![0i32; rows.len() * MAX_BLOCKS];
    let (mut qsl, mut cqsl, mut seq_lens) = (vec![0i32], vec![0i32], Vec::new());
    let (mut key, mut value) = (Vec::new(), Vec::new());
    let mut cross_indices = Vec::new();
    // History and this step's K/V per row, contiguous, to recompute the expectation independently.
    let mut hist: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        block_tables[r * MAX_BLOCKS..r * MAX_BLOCKS + row.blocks.len()]
            .copy_from_slice(&row.blocks);
        let seq_len = row.computed + row.scheduled;
        let slot =
            |p: usize| (row.blocks[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE) as i64;
        let (k, v) = (
            random(&mut rng, seq_len * kvl),
            random(&mut rng, seq_len * kvl),
        );
        // Earlier steps' K/V are already in the cache.
        let past: Vec<i64> = (0..row.computed).map(slot).collect();
        kv.write_kv_slices(
            0,
            0,
            &past,
            &k[..row.computed * kvl],
            &v[..row.computed * kvl],
        )?;
        slot_mapping.extend((row.computed..seq_len).map(slot));
        key.extend_from_slice(&k[row.computed * kvl..]);
        value.extend_from_slice(&v[row.computed * kvl..]);
        let t0 = *qsl.last().unwrap() as usize;
        cross_indices
            .extend((t0 + row.scheduled - row.cross..t0 + row.scheduled).map(|t| t as i32));
        qsl.push((t0 + row.scheduled) as i32);
        cqsl.push(cross_indices.len() as i32);
        seq_lens.push(seq_len as i32);
        hist.push((k, v));
    }
    let t = slot_mapping.len();
    let x = cross_indices.len();
    for i in t..TOKENS_PADDED {
        slot_mapping.push((i % BLOCK_SIZE) as i64);
        key.extend(random(&mut rng, kvl));
        value.extend(random(&mut rng, kvl));
    }
    kv.write_kv_slices(0, 0, &slot_mapping, &key, &value)?;
    let last = *cross_indices.last().unwrap();
    cross_indices.resize(CROSS_PADDED, last);
    let query = random(&mut rng, TOKENS_PADDED * ql);
    let cross_query = random(&mut rng, CROSS_PADDED * ql);

    let mut arrays = vec![
        (
            "query".to_string(),
            f32s(query.clone(), &[TOKENS_PADDED, h.num_heads, h.head_dim])?,
        ),
        (
            "key".to_string(),
            f32s(key, &[TOKENS_PADDED, h.kv_heads, h.head_dim])?,
        ),
        (
            "value".to_string(),
            f32s(value, &[TOKENS_PADDED, h.kv_heads, h.head_dim])?,
        ),
        (
            "slot_mapping".to_string(),
            Tensor::from_vec(slot_mapping, TOKENS_PADDED, &Device::Cpu)?,
        ),
    ];
    let (kc, vc) = kv.tensors(0, 0)?;
    arrays.push(("k_cache".into(), kc));
    arrays.push(("v_cache".into(), vc));
    arrays.push((
        "block_tables".into(),
        i32s(block_tables.clone(), &[rows.len(), MAX_BLOCKS])?,
    ));
    arrays.push((
        "query_start_loc".into(),
        i32s(qsl.clone(), &[rows.len() + 1])?,
    ));
    arrays.push(("seq_lens".into(), i32s(seq_lens.clone(), &[rows.len()])?));
    arrays.push(("num_tokens".into(), i32s(vec![t as i32], &[])?));
    arrays.push(("scale".into(), f32s(vec![1.0], &[])?));
    arrays.push((
        "sliding_windows".into(),
        i32s(
            WINDOWS.iter().map(|&w| w as i32).collect(),
            &[WINDOWS.len()],
        )?,
    ));
    arrays.push((
        "cross_query".into(),
        f32s(
            cross_query.clone(),
            &[CROSS_PADDED, h.num_heads, h.head_dim],
        )?,
    ));
    arrays.push((
        "cross_indices".into(),
        i32s(cross_indices.clone(), &[CROSS_PADDED])?,
    ));
    arrays.push((
        "cross_query_start_loc".into(),
        i32s(cqsl.clone(), &[rows.len() + 1])?,
    ));
    arrays.push(("num_cross".into(), i32s(vec![x as i32], &[])?));

    // Expected outputs, from paged memory; asserted equal to the contiguous computation.
    let tables: Vec<&[i32]> = block_tables.chunks(MAX_BLOCKS).collect();
    let hk: Vec<Tensor> = hist
        .iter()
        .map(|(k, _)| f32s(k.clone(), &[k.len() / kvl, h.kv_heads, h.head_dim]))
        .collect::<Result<_>>()?;
    let hv: Vec<Tensor> = hist
        .iter()
        .map(|(_, v)| f32s(v.clone(), &[v.len() / kvl, h.kv_heads, h.head_dim]))
        .collect::<Result<_>>()?;
    let q = f32s(query, &[TOKENS_PADDED, h.num_heads, h.head_dim])?;
    let cq = f32s(cross_query, &[CROSS_PADDED, h.num_heads, h.head_dim])?;
    for w in WINDOWS {
        let window = (w > 0).then_some(w);
        for (name, q, loc) in [("out", &q, &qsl), ("cross_out", &cq, &cqsl)] {
            let v = Varlen {
                query_start_loc: loc,
                seq_lens: &seq_lens,
                scale: 1.0,
                window,
            };
            let paged = paged_attention(q, &kv, 0, 0, &tables, &v)?;
            let contiguous = contiguous_attention(q, &hk, &hv, &v)?;
            let (a, b): (Vec<f32>, Vec<f32>) = (
                paged.flatten_all()?.to_vec1()?,
                contiguous.flatten_all()?.to_vec1()?,
            );
            assert_eq!(
                a, b,
                "golden: paged and contiguous attention differ ({name}, window {w})"
            );
            arrays.push((format!("{name}_window{w}"), paged));
        }
    }
    Ok(Fixture {
        name: "paged_attention",
        arrays,
    })
}

fn write_and_copy() -> Result<Fixture> {
    let h = HEADS;
    let kvl = h.kv_len();
    let geo = KvGeometry {
        block_size: BLOCK_SIZE,
        kv_heads: h.kv_heads,
        head_dim: h.head_dim,
    };
    let mut rng = Rng::new(7);
    let mut kv = PagedKv::new(geo, &[5], &[1], Fill::Random(5))?;
    let (k0, v0) = kv.tensors(0, 0)?;
    let (k0, v0) = (k0.copy()?, v0.copy()?);
    // A sub-block match of 12 tokens copied 3 -> 1 and one of 5 tokens copied 2 -> 4; then the step
    // writes its tokens: the copy destinations' next slots, and two padding tokens into block 0.
    let copies = [
        CopyOp {
            group: 0,
            src: 3,
            dst: 1,
            num_tokens: 12,
        },
        CopyOp {
            group: 0,
            src: 2,
            dst: 4,
            num_tokens: 5,
        },
    ];
    kv.copy_blocks(&copies)?;
    let (k1, v1) = kv.tensors(0, 0)?;
    let (k1, v1) = (k1.copy()?, v1.copy()?);
    let slots: Vec<i64> = vec![16 + 12, 16 + 13, 16 + 14, 16 + 15, 4 * 16 + 5, 0, 1];
    let key = random(&mut rng, slots.len() * kvl);
    let value = random(&mut rng, slots.len() * kvl);
    kv.write_kv_slices(0, 0, &slots, &key, &value)?;
    let (k2, v2) = kv.tensors(0, 0)?;
    let n = slots.len();
    let flat: Vec<i32> = copies
        .iter()
        .flat_map(|c| {
            [
                c.group as i32,
                c.src as i32,
                c.dst as i32,
                c.num_tokens as i32,
            ]
        })
        .collect();
    Ok(Fixture {
        name: "write_and_copy",
        arrays: vec![
            ("k_cache_before".into(), k0),
            ("v_cache_before".into(), v0),
            ("kv_copies".into(), i32s(flat, &[copies.len(), 4])?),
            ("k_cache_after_copy".into(), k1),
            ("v_cache_after_copy".into(), v1),
            (
                "slot_mapping".into(),
                Tensor::from_vec(slots, n, &Device::Cpu)?,
            ),
            ("key".into(), f32s(key, &[n, h.kv_heads, h.head_dim])?),
            ("value".into(), f32s(value, &[n, h.kv_heads, h.head_dim])?),
            ("k_cache_after_write".into(), k2),
            ("v_cache_after_write".into(), v2),
        ],
    })
}

/// Writes every fixture as `<dir>/<name>.npz`.
pub fn write_all(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| crate::Error(format!("{}: {e}", dir.display())))?;
    for f in fixtures()? {
        let arrays: Vec<(&str, &Tensor)> = f.arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Tensor::write_npz(&arrays, dir.join(format!("{}.npz", f.name)))?;
    }
    Ok(())
}
