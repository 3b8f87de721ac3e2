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
fn cbor_head(out: &mut Vec<u8>, major: u8, n: u64) {
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

fn cbor_text(out: &mut Vec<u8>, s: &str) {
    cbor_head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn cbor_bytes(out: &mut Vec<u8>, b: &[u8]) {
    cbor_head(out, 2, b.len() as u64);
    out.extend_from_slice(b);
}

const CBOR_NULL: u8 = 0xf6;

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

/// The CBOR-encoded extra keys of one request: for the first sub-block and for all others.
#[derive(Debug, Clone)]
pub(crate) struct EncodedExtras {
    pub first: Vec<u8>,
    pub rest: Vec<u8>,
}

impl EncodedExtras {
    pub fn new(extras: &HashExtras) -> Self {
        EncodedExtras {
            first: encode_extras(extras, true),
            rest: encode_extras(extras, false),
        }
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
    hashes.reserve(complete - hashes.len());
    for i in hashes.len()..complete {
        let parent = if i == 0 { *root } else { hashes[i - 1] };
        let ex = if i == 0 { &extras.first } else { &extras.rest };
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
}
