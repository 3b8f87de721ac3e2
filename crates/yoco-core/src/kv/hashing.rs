//! Chained sub-block hashes: vLLM's `sha256_cbor` scheme (scheduler.md §5.3), so hashes (and the
//! KV events that carry them) interoperate with vLLM-compatible routers.
//!
//! `h_i = SHA-256(CBOR([h_{i-1} as bytes, [tokens of sub-block i], extras_i | null]))` with
//! `h_{-1} = NONE_HASH = SHA-256(CBOR(seed))` and the seed `"vllm-none-hash"` unless configured.
//! Extra keys are tagged tuples in vLLM's order: `("lora", name, path)` on every sub-block, then
//! `("cache_salt", salt)` on the sub-block starting at token 0 only. Because each hash commits to the
//! whole prefix, equal hashes mean equal prefixes (up to SHA-256 collisions), which is what lets a
//! flat `hash -> blocks` map act as a prefix trie.

use std::fmt;
use std::hash::{Hash, Hasher};

use sha2::{Digest, Sha256};

use super::mm_keys::{encode_sub_block_extras, MmPlaceholder};
use super::HashExtras;

/// The vLLM default root seed for SHA-256 hashing.
pub const DEFAULT_HASH_SEED: &[u8] = b"vllm-none-hash";

/// A 32-byte SHA-256 digest naming one sub-block and its whole prefix.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl BlockHash {
    /// vLLM's int form (events): the low 64 bits of the big-endian digest, i.e. the last 8 bytes.
    pub fn to_u64(&self) -> u64 {
        u64::from_be_bytes(self.0[24..32].try_into().unwrap())
    }
}

impl Hash for BlockHash {
    /// The digest is already uniformly random: feed 8 of its bytes to the map's hasher.
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from_le_bytes(self.0[0..8].try_into().unwrap()));
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..")
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Canonical CBOR head: major type + argument in the shortest form.
pub(crate) fn cbor_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n < 0x100 {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n < 0x1_0000 {
        out.push(m | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n < 0x1_0000_0000 {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

pub(crate) fn cbor_text(out: &mut Vec<u8>, s: &str) {
    cbor_head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn cbor_bytes(out: &mut Vec<u8>, b: &[u8]) {
    cbor_head(out, 2, b.len() as u64);
    out.extend_from_slice(b);
}

pub(crate) const CBOR_NULL: u8 = 0xf6;

/// `NONE_HASH` for a seed: SHA-256 of the seed's CBOR form. A UTF-8 seed is encoded as a text
/// string (vLLM hashes the `PYTHONHASHSEED` / default *string*), anything else as a byte string.
pub fn root_hash(seed: &[u8]) -> BlockHash {
    let mut buf = Vec::with_capacity(seed.len() + 9);
    match std::str::from_utf8(seed) {
        Ok(s) => cbor_text(&mut buf, s),
        Err(_) => cbor_bytes(&mut buf, seed),
    }
    BlockHash(Sha256::digest(&buf).into())
}

/// The CBOR-encoded extra keys of one request: for the first sub-block and for all others when
/// the request has no multimodal items; otherwise the pieces each sub-block's extras are built from.
#[derive(Debug, Clone)]
pub(crate) struct EncodedExtras {
    pub first: Vec<u8>,
    pub rest: Vec<u8>,
    /// The encoded `("lora", name, path)` tuple, empty without a LoRA.
    lora: Vec<u8>,
    /// The encoded `("cache_salt", salt)` tuple, empty without a salt.
    salt: Vec<u8>,
    /// Placeholder runs, sorted and disjoint (validated by the scheduler).
    mm: Vec<MmPlaceholder>,
}

impl EncodedExtras {
    #[cfg(test)]
    pub fn new(extras: &HashExtras) -> Self {
        Self::with_mm(extras, Vec::new())
    }

    /// Extras with multimodal items: each sub-block overlapping an item's run hashes the item's
    /// identifier and start offset (`mm_keys`).
    pub fn with_mm(extras: &HashExtras, mm: Vec<MmPlaceholder>) -> Self {
        let mut lora = Vec::new();
        if let Some((name, path)) = &extras.lora {
            cbor_head(&mut lora, 4, 3);
            cbor_text(&mut lora, "lora");
            cbor_text(&mut lora, name);
            cbor_text(&mut lora, path);
        }
        let mut salt = Vec::new();
        if let Some(s) = &extras.cache_salt {
            cbor_head(&mut salt, 4, 2);
            cbor_text(&mut salt, "cache_salt");
            cbor_text(&mut salt, s);
        }
        EncodedExtras {
            first: encode_extras(extras, true),
            rest: encode_extras(extras, false),
            lora,
            salt,
            mm,
        }
    }

    /// The extras of sub-block `i` (tokens `i * sbs .. (i + 1) * sbs`); `scratch` holds them when
    /// they depend on the sub-block (multimodal items).
    fn for_sub_block<'a>(&'a self, i: usize, sbs: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        if self.mm.is_empty() {
            return if i == 0 { &self.first } else { &self.rest };
        }
        let start = (i * sbs) as u64;
        encode_sub_block_extras(
            scratch,
            &self.lora,
            &self.salt,
            &self.mm,
            start,
            start + sbs as u64,
        );
        scratch
    }
}

fn encode_extras(extras: &HashExtras, first: bool) -> Vec<u8> {
    let salt = extras.cache_salt.as_deref().filter(|_| first);
    let n = extras.lora.is_some() as u64 + salt.is_some() as u64;
    let mut out = Vec::new();
    if n == 0 {
        out.push(CBOR_NULL);
        return out;
    }
    cbor_head(&mut out, 4, n);
    if let Some((name, path)) = &extras.lora {
        cbor_head(&mut out, 4, 3);
        cbor_text(&mut out, "lora");
        cbor_text(&mut out, name);
        cbor_text(&mut out, path);
    }
    if let Some(salt) = salt {
        cbor_head(&mut out, 4, 2);
        cbor_text(&mut out, "cache_salt");
        cbor_text(&mut out, salt);
    }
    out
}

/// Hash of one sub-block given its parent, its tokens and its encoded extra keys. `buf` is scratch.
pub(crate) fn hash_sub_block(
    parent: &BlockHash,
    tokens: &[u32],
    extras: &[u8],
    buf: &mut Vec<u8>,
) -> BlockHash {
    buf.clear();
    buf.push(0x83); // array of 3
    cbor_bytes(buf, &parent.0);
    cbor_head(buf, 4, tokens.len() as u64);
    for &t in tokens {
        cbor_head(buf, 0, t as u64);
    }
    buf.extend_from_slice(extras);
    BlockHash(Sha256::digest(&buf[..]).into())
}

/// Extends `hashes` over the complete sub-blocks of `tokens` (incremental: resumes after the last
/// hashed sub-block).
pub(crate) fn extend_chain(
    root: &BlockHash,
    extras: &EncodedExtras,
    sub_block_size: usize,
    tokens: &[u32],
    hashes: &mut Vec<BlockHash>,
) {
    let complete = tokens.len() / sub_block_size;
    if hashes.len() >= complete {
        return;
    }
    let mut buf = Vec::with_capacity(40 + sub_block_size * 5 + extras.first.len());
    let mut scratch = Vec::new();
    hashes.reserve(complete - hashes.len());
    for i in hashes.len()..complete {
        let parent = if i == 0 { *root } else { hashes[i - 1] };
        let ex = extras.for_sub_block(i, sub_block_size, &mut scratch);
        let h = hash_sub_block(
            &parent,
            &tokens[i * sub_block_size..(i + 1) * sub_block_size],
            ex,
            &mut buf,
        );
        hashes.push(h);
    }
}

#[cfg(test)]
mod tests {
    //! scheduler.md §10.2 (HASH-1, 3, 7, 10) and §11.6 SB-1, against the test vectors of §5.3.
    use super::*;

    fn hex(h: &BlockHash) -> String {
        h.to_string()
    }

    fn chain(extras: &HashExtras, sbs: usize, tokens: &[u32]) -> Vec<BlockHash> {
        let mut out = Vec::new();
        extend_chain(
            &root_hash(DEFAULT_HASH_SEED),
            &EncodedExtras::new(extras),
            sbs,
            tokens,
            &mut out,
        );
        out
    }

    #[test]
    fn root_hash_matches_vllm_sha256_cbor_none_hash() {
        assert_eq!(
            hex(&root_hash(DEFAULT_HASH_SEED)),
            "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
        );
        // stable across calls; another seed gives another root
        assert_eq!(root_hash(DEFAULT_HASH_SEED), root_hash(b"vllm-none-hash"));
        assert_ne!(root_hash(b"42"), root_hash(DEFAULT_HASH_SEED));
    }

    #[test]
    fn sub_block_hashes_match_vllm_sha256_cbor_vectors() {
        let h = chain(&HashExtras::default(), 4, &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            hex(&h[0]),
            "c49ab11fb576db6f376aef58c24f728a0ba1807e8cac5f940f1a5c4c20741898"
        );
        assert_eq!(
            hex(&h[1]),
            "9d0a7c928c548f9aeea31ae98471cf515045a206851732ac14cb3083c18d40f9"
        );
        assert_eq!(h[0].to_u64(), 1088283741995145368);
        let salted = HashExtras {
            cache_salt: Some("salt".into()),
            lora: None,
        };
        let h = chain(&salted, 4, &[0, 1, 2, 3]);
        assert_eq!(
            hex(&h[0]),
            "8987d7583ea6dc333eec117d9e0b661eda7688392314bbbf74838ab127442082"
        );
    }

    #[test]
    fn cbor_encoding_of_the_first_sub_block_is_canonical() {
        let mut buf = Vec::new();
        let root = root_hash(DEFAULT_HASH_SEED);
        hash_sub_block(&root, &[0, 1, 2, 3], &[CBOR_NULL], &mut buf);
        let mut want = vec![0x83, 0x58, 0x20];
        want.extend_from_slice(&root.0);
        want.extend_from_slice(&[0x84, 0, 1, 2, 3, 0xf6]);
        assert_eq!(buf, want);
        // large token ids use the shortest argument form
        hash_sub_block(
            &root,
            &[23, 24, 255, 256, 65535, 65536],
            &[CBOR_NULL],
            &mut buf,
        );
        assert_eq!(
            &buf[35..],
            &[0x86, 23, 0x18, 24, 0x18, 255, 0x19, 1, 0, 0x19, 255, 255, 0x1a, 0, 1, 0, 0, 0xf6]
        );
    }

    #[test]
    fn only_complete_sub_blocks_are_hashed_and_chained() {
        // HASH-3 / SB-1
        let e = HashExtras::default();
        assert!(chain(&e, 4, &[]).is_empty());
        assert!(chain(&e, 4, &[1, 2, 3]).is_empty());
        assert_eq!(chain(&e, 4, &[1, 2, 3, 4]).len(), 1);
        let h = chain(&e, 3, &[0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(h.len(), 2);
        let mut buf = Vec::new();
        let root = root_hash(DEFAULT_HASH_SEED);
        assert_eq!(
            h[0],
            hash_sub_block(&root, &[0, 1, 2], &[CBOR_NULL], &mut buf)
        );
        assert_eq!(
            h[1],
            hash_sub_block(&h[0], &[3, 4, 5], &[CBOR_NULL], &mut buf)
        );
        // the chain commits to the prefix: same tokens after a different prefix hash differently
        assert_ne!(chain(&e, 3, &[9, 1, 2, 3, 4, 5])[1], h[1]);
    }

    #[test]
    fn incremental_hashing_equals_one_shot() {
        // HASH-10 / SB-1, with extra keys
        let e = HashExtras {
            cache_salt: Some("s".into()),
            lora: Some(("a".into(), "/p".into())),
        };
        let tokens: Vec<u32> = (0..37).map(|i| (i * 7919) % 50_000).collect();
        let one_shot = chain(&e, 4, &tokens);
        let mut inc = Vec::new();
        let (root, ex) = (root_hash(DEFAULT_HASH_SEED), EncodedExtras::new(&e));
        for n in 0..=tokens.len() {
            extend_chain(&root, &ex, 4, &tokens[..n], &mut inc);
        }
        assert_eq!(inc, one_shot);
        assert_eq!(inc.len(), 9);
    }

    #[test]
    fn salt_and_lora_are_tagged_namespaces() {
        // HASH-7 and issue #44701: a LoRA named "foo" and a salt "foo" never collide; the salt only
        // enters the first sub-block, the LoRA (name and path) every sub-block.
        let t: Vec<u32> = (0..8).collect();
        let plain = chain(&HashExtras::default(), 4, &t);
        let salt = chain(
            &HashExtras {
                cache_salt: Some("foo".into()),
                lora: None,
            },
            4,
            &t,
        );
        let lora = chain(
            &HashExtras {
                cache_salt: None,
                lora: Some(("foo".into(), "/a".into())),
            },
            4,
            &t,
        );
        let lora2 = chain(
            &HashExtras {
                cache_salt: None,
                lora: Some(("foo".into(), "/b".into())),
            },
            4,
            &t,
        );
        assert_ne!(salt[0], lora[0]);
        assert_ne!(salt[0], plain[0]);
        assert_ne!(lora[0], lora2[0]);
        let ex = EncodedExtras::new(&HashExtras {
            cache_salt: Some("foo".into()),
            lora: None,
        });
        assert_eq!(ex.rest, vec![CBOR_NULL], "salt only on the first sub-block");
        let ex = EncodedExtras::new(&HashExtras {
            cache_salt: None,
            lora: Some(("foo".into(), "/a".into())),
        });
        assert_eq!(ex.first, ex.rest, "lora on every sub-block");
    }

    fn mm_chain(
        extras: &HashExtras,
        items: &[(u32, u32, &str)],
        sbs: usize,
        tokens: &[u32],
    ) -> Vec<BlockHash> {
        let mm = items
            .iter()
            .map(|&(offset, length, id)| MmPlaceholder {
                offset,
                length,
                identifier: id.into(),
            })
            .collect();
        let mut out = Vec::new();
        extend_chain(
            &root_hash(DEFAULT_HASH_SEED),
            &EncodedExtras::with_mm(extras, mm),
            sbs,
            tokens,
            &mut out,
        );
        out
    }

    #[test]
    fn multimodal_extra_keys_match_vllm_sha256_cbor_vectors() {
        // Vectors from an independent CBOR + SHA-256 encoding of vLLM's
        // `(parent, tokens, (("mm", id, item_start - block_start), ...))` (HASH-4 / HASH-5 / PC-8).
        let t: Vec<u32> = (0..12).collect();
        let h = mm_chain(&HashExtras::default(), &[(2, 5, "abc")], 4, &t);
        let hexes: Vec<String> = h.iter().map(hex).collect();
        assert_eq!(
            hexes,
            [
                "a60e1884d6d4d88c7b82dca88a0351a21ed4e646a285c5f7c9044365b8c3b288", // ("mm","abc",2)
                "226172ddf7843f9a78d1522d943ea644eb96ead23fd6fe6976a505523cda5e26", // ("mm","abc",-2)
                "622c394093f1bd3afc7a91a607e66fbd678001998678abb7a732b80f593c7ace", // null, chained
            ]
        );
        // LoRA first, items in order, the salt on sub-block 0 only
        let e = HashExtras {
            cache_salt: Some("s".into()),
            lora: Some(("a".into(), "/p".into())),
        };
        let h = mm_chain(&e, &[(1, 2, "x"), (3, 6, "y")], 4, &t);
        let hexes: Vec<String> = h.iter().map(hex).collect();
        assert_eq!(
            hexes,
            [
                "be2bcbec328859f876eb5683b1eac598fe0a91053ddfc166656fac6cd02de068",
                "172a5e7c6667db3e73ab21f432a95bcf7d4db7349978002f086e416224c4d55d",
                "2b800ff3cf36f809ae002b07157654432a6f9370c8cbc1dc171731cfd20f57f8",
            ]
        );
    }

    #[test]
    fn another_item_changes_every_hash_from_its_first_sub_block_on() {
        let t: Vec<u32> = (0..16).collect();
        let plain = chain(&HashExtras::default(), 4, &t);
        let a = mm_chain(&HashExtras::default(), &[(5, 6, "img-a")], 4, &t);
        let a2 = mm_chain(&HashExtras::default(), &[(5, 6, "img-a")], 4, &t);
        let b = mm_chain(&HashExtras::default(), &[(5, 6, "img-b")], 4, &t);
        assert_eq!(a, a2, "the same item hashes the same");
        // sub-block 0 (tokens 0..4) does not touch the run [5, 11): shared with the text-only chain
        assert_eq!(a[0], plain[0]);
        assert_eq!(a[0], b[0]);
        // from sub-block 1 on (the run starts there) every hash differs, sub-block 3 included,
        // which lies after the run
        for i in 1..4 {
            assert_ne!(a[i], b[i], "sub-block {i}");
            assert_ne!(a[i], plain[i], "sub-block {i}");
        }
        // same identifier, other position: another chain
        let moved = mm_chain(&HashExtras::default(), &[(4, 6, "img-a")], 4, &t);
        assert_ne!(moved[1], a[1]);
        // no items: the plain chain exactly
        assert_eq!(mm_chain(&HashExtras::default(), &[], 4, &t), plain);
    }

    #[test]
    fn incremental_hashing_with_items_equals_one_shot() {
        // HASH-10 across multiple mm items
        let tokens: Vec<u32> = (0..37).map(|i| (i * 31) % 1000).collect();
        let items = [(3u32, 9u32, "p"), (14, 1, "q"), (20, 12, "r")];
        let one_shot = mm_chain(&HashExtras::default(), &items, 4, &tokens);
        let mm: Vec<MmPlaceholder> = items
            .iter()
            .map(|&(offset, length, id)| MmPlaceholder {
                offset,
                length,
                identifier: id.into(),
            })
            .collect();
        let ex = EncodedExtras::with_mm(&HashExtras::default(), mm);
        let root = root_hash(DEFAULT_HASH_SEED);
        let mut inc = Vec::new();
        for n in 0..=tokens.len() {
            extend_chain(&root, &ex, 4, &tokens[..n], &mut inc);
        }
        assert_eq!(inc, one_shot);
        assert_eq!(inc.len(), 9);
    }
}
