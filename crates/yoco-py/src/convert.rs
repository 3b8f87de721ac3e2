//! Conversions at the boundary that are not per step: configuration strings, request prompts,
//! KV groups, stats and events as Python dicts.

use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use yoco_core::kv::{AttnKind, KvEvent, KvGroup, LayerKind};
use yoco_core::sched::{Policy, SchedulerStats};

/// `"full" | "sliding:W" | "shared:DONOR"` per layer.
pub fn layer_kinds(kinds: &[String]) -> PyResult<Vec<LayerKind>> {
    kinds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let bad = || {
                PyValueError::new_err(format!(
                    "layer_kinds[{i}] = {s:?}: expected \"full\", \"sliding:W\" (window W >= 1) or \"shared:DONOR\" (an earlier layer index)"
                ))
            };
            let (kind, arg) = s.split_once(':').map_or((s.as_str(), None), |(k, a)| (k, Some(a)));
            match (kind, arg) {
                ("full", None) => Ok(LayerKind::Full),
                ("sliding", Some(w)) => match w.parse::<u32>() {
                    Ok(window) if window >= 1 => Ok(LayerKind::Sliding { window }),
                    _ => Err(bad()),
                },
                ("shared", Some(d)) => d.parse::<usize>().map(|donor| LayerKind::SharesKv { donor }).map_err(|_| bad()),
                _ => Err(bad()),
            }
        })
        .collect()
}

pub fn policy(s: &str) -> PyResult<Policy> {
    match s {
        "fcfs" => Ok(Policy::Fcfs),
        "priority" => Ok(Policy::Priority),
        _ => Err(PyValueError::new_err(format!(
            "policy = {s:?}: expected \"fcfs\" or \"priority\""
        ))),
    }
}

/// `int` (every group) or `list[int]` (one per group).
pub fn num_blocks(v: &Bound<'_, PyAny>, num_groups: usize) -> PyResult<Vec<u32>> {
    if let Ok(n) = v.extract::<u32>() {
        return Ok(vec![n; num_groups]);
    }
    let list: Vec<u32> = v.extract().map_err(|_| {
        PyValueError::new_err(
            "num_blocks: expected a non-negative int or a list of them (one per KV group)",
        )
    })?;
    if list.len() != num_groups {
        return Err(PyValueError::new_err(format!(
            "num_blocks has {} entries but the layers form {num_groups} KV groups; give one per group or a single int",
            list.len()
        )));
    }
    Ok(list)
}

fn check_ids<T: Copy + TryInto<u32> + std::fmt::Display>(v: &[T]) -> PyResult<Vec<u32>> {
    v.iter()
        .enumerate()
        .map(|(i, &t)| {
            t.try_into().map_err(|_| {
                PyValueError::new_err(format!(
                    "prompt[{i}] = {t} is not a token id (0 <= id < 2**32)"
                ))
            })
        })
        .collect()
}

/// A prompt: a 1-D int32/uint32/int64 numpy array or a sequence of ints.
pub fn prompt(v: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, i32>>() {
        return check_ids(&a.as_array().to_vec());
    }
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, u32>>() {
        return Ok(a.as_array().to_vec());
    }
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, i64>>() {
        return check_ids(&a.as_array().to_vec());
    }
    let list: Vec<i64> = v.extract().map_err(|_| {
        PyValueError::new_err(
            "prompt: expected a 1-D numpy int32/uint32/int64 array or a list of ints",
        )
    })?;
    check_ids(&list)
}

pub fn group_dict<'py>(py: Python<'py>, g: &KvGroup) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let (kind, window) = match g.kind {
        AttnKind::Full => ("full", None),
        AttnKind::Sliding { window } => ("sliding", Some(window)),
    };
    d.set_item("kind", kind)?;
    d.set_item("window", window)?;
    d.set_item("layers", g.layers.clone())?;
    d.set_item("readers", g.readers.clone())?;
    Ok(d)
}

pub fn stats_dict<'py>(py: Python<'py>, s: &SchedulerStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("running", s.num_running)?;
    d.set_item("waiting", s.num_waiting)?;
    d.set_item("preemptions", s.num_preemptions)?;
    let k = &s.kv;
    for (name, v) in [
        ("blocks_total", k.blocks_total),
        ("blocks_free", k.blocks_free),
        ("blocks_used", k.blocks_used),
        ("blocks_cached", k.blocks_cached),
        ("prefix_query_tokens", k.prefix_query_tokens),
        ("prefix_hit_tokens", k.prefix_hit_tokens),
        ("copies", k.copies),
        ("copied_tokens", k.copied_tokens),
        ("adoptions", k.adoptions),
    ] {
        d.set_item(name, v)?;
    }
    Ok(d)
}

pub fn events_list<'py>(py: Python<'py>, events: Vec<KvEvent>) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for e in events {
        let d = PyDict::new(py);
        match e {
            KvEvent::Stored {
                group,
                parent,
                hashes,
                token_ids,
                block_size,
            } => {
                d.set_item("type", "stored")?;
                d.set_item("group", group)?;
                d.set_item("parent", parent)?;
                d.set_item("hashes", hashes)?;
                d.set_item("token_ids", token_ids)?;
                d.set_item("block_size", block_size)?;
            }
            KvEvent::Removed { group, hashes } => {
                d.set_item("type", "removed")?;
                d.set_item("group", group)?;
                d.set_item("hashes", hashes)?;
            }
            KvEvent::AllCleared => {
                d.set_item("type", "all_cleared")?;
            }
        }
        out.append(d)?;
    }
    Ok(out)
}
