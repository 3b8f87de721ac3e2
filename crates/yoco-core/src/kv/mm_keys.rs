//! Multimodal extra keys of the hash chain (vLLM's `("mm", identifier, offset)`, scheduler.md §5.3).
//!
//! An image or audio clip enters the prompt as a run of placeholder tokens whose ids say nothing
//! about the content (every image's run is the same `<image_soft_token>` id). So every sub-block
//! that overlaps an item's run hashes the item's content identifier and where the item starts
//! relative to the sub-block (negative when the run began in an earlier sub-block): the same text
//! with another image diverges from the first sub-block that touches the run, and, since the chain
//! commits to the whole prefix, stays diverged after it.
//!
//! Order inside one sub-block's extras, as vLLM: `("lora", name, path)`, then one `("mm", id,
//! offset)` per overlapping item in prompt order, then `("cache_salt", salt)` on sub-block 0 only.

/// One multimodal item's placeholder run in a prompt: tokens `offset .. offset + length` are the
/// item's embeddings, `identifier` names its content (the engine's content hash, hex).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MmPlaceholder {
    /// First placeholder token of the run (a prompt index).
    pub offset: u32,
    /// Placeholder tokens in the run (the item's encoder output rows), >= 1.
    pub length: u32,
    /// The item's content identifier (the engine's content hash, hex), non-empty.
    pub identifier: String,
}

impl From<(u32, u32, String)> for MmPlaceholder {
    /// `(offset, length, identifier)`, the bindings' tuple form.
    fn from((offset, length, identifier): (u32, u32, String)) -> Self {
        Self {
            offset,
            length,
            identifier,
        }
    }
}

impl MmPlaceholder {
    /// One past the run's last token.
    pub fn end(&self) -> u64 {
        self.offset as u64 + self.length as u64
    }
}

/// Canonical CBOR integer: major type 0 for `v >= 0`, 1 (`-1 - n`) for negative values.
pub(crate) fn cbor_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        super::hashing::cbor_head(out, 0, v as u64);
    } else {
        super::hashing::cbor_head(out, 1, (-1 - v) as u64);
    }
}

/// The items overlapping tokens `start .. end` (items are sorted and disjoint), as a range of
/// indices into `items`.
pub(crate) fn overlapping(items: &[MmPlaceholder], start: u64, end: u64) -> std::ops::Range<usize> {
    let lo = items.partition_point(|m| m.end() <= start);
    let hi = lo + items[lo..].partition_point(|m| (m.offset as u64) < end);
    lo..hi
}

/// Encodes the extras of one sub-block covering tokens `start .. end` into `out`: CBOR null when
/// there are none, else an array of tagged tuples. `lora` and `salt` are the already encoded
/// tuples (empty when absent); the salt goes in only when `start == 0`.
pub(crate) fn encode_sub_block_extras(
    out: &mut Vec<u8>,
    lora: &[u8],
    salt: &[u8],
    items: &[MmPlaceholder],
    start: u64,
    end: u64,
) {
    out.clear();
    let mm = overlapping(items, start, end);
    let with_salt = start == 0 && !salt.is_empty();
    let n = (!lora.is_empty()) as u64 + mm.len() as u64 + with_salt as u64;
    if n == 0 {
        out.push(super::hashing::CBOR_NULL);
        return;
    }
    super::hashing::cbor_head(out, 4, n);
    out.extend_from_slice(lora);
    for m in &items[mm] {
        super::hashing::cbor_head(out, 4, 3);
        super::hashing::cbor_text(out, "mm");
        super::hashing::cbor_text(out, &m.identifier);
        cbor_int(out, m.offset as i64 - start as i64);
    }
    if with_salt {
        out.extend_from_slice(salt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(offset: u32, length: u32, id: &str) -> MmPlaceholder {
        MmPlaceholder {
            offset,
            length,
            identifier: id.into(),
        }
    }

    #[test]
    fn overlap_selects_items_touching_the_range() {
        // HASH-5: 20 tokens, items [0,5) "hash1" and [10,15) "hash2".
        let items = [item(0, 5, "hash1"), item(10, 5, "hash2")];
        assert_eq!(overlapping(&items, 0, 5), 0..1);
        assert_eq!(overlapping(&items, 3, 8), 0..1);
        assert_eq!(overlapping(&items, 6, 10), 1..1);
        assert_eq!(overlapping(&items, 0, 15), 0..2);
        assert_eq!(overlapping(&items, 14, 20), 1..2);
        assert_eq!(overlapping(&items, 15, 20), 2..2);
        assert_eq!(overlapping(&[], 0, 4), 0..0);
    }

    #[test]
    fn negative_offsets_use_cbor_major_type_one() {
        let mut b = Vec::new();
        cbor_int(&mut b, -3);
        assert_eq!(b, [0x22]);
        b.clear();
        cbor_int(&mut b, -25);
        assert_eq!(b, [0x38, 24]);
        b.clear();
        cbor_int(&mut b, 11);
        assert_eq!(b, [0x0b]);
    }

    #[test]
    fn sub_block_extras_bytes_are_vllm_tagged_tuples() {
        let items = [item(0, 5, "h1"), item(10, 5, "h2")];
        let mut out = Vec::new();
        // [3, 8): (("mm", "h1", -3),)
        encode_sub_block_extras(&mut out, &[], &[], &items, 3, 8);
        assert_eq!(out, [0x81, 0x83, 0x62, b'm', b'm', 0x62, b'h', b'1', 0x22]);
        // [6, 10): nothing
        encode_sub_block_extras(&mut out, &[], &[], &items, 6, 10);
        assert_eq!(out, [0xf6]);
        // [0, 15) with a salt: (("mm","h1",0), ("mm","h2",10), ("cache_salt","s"))
        let mut salt = Vec::new();
        super::super::hashing::cbor_head(&mut salt, 4, 2);
        super::super::hashing::cbor_text(&mut salt, "cache_salt");
        super::super::hashing::cbor_text(&mut salt, "s");
        encode_sub_block_extras(&mut out, &[], &salt, &items, 0, 15);
        let mut want = vec![0x83];
        want.extend_from_slice(&[0x83, 0x62, b'm', b'm', 0x62, b'h', b'1', 0x00]);
        want.extend_from_slice(&[0x83, 0x62, b'm', b'm', 0x62, b'h', b'2', 0x0a]);
        want.extend_from_slice(&salt);
        assert_eq!(out, want);
        // the salt only on the sub-block starting at token 0
        encode_sub_block_extras(&mut out, &[], &salt, &items, 10, 15);
        assert_eq!(out, [0x81, 0x83, 0x62, b'm', b'm', 0x62, b'h', b'2', 0x00]);
    }
}
