//! Golden bytes: `KVEventBatch` payloads as msgspec (vLLM's encoder) writes them. The hex strings
//! were produced by msgspec 0.19 from vLLM's struct definitions (`array_like=True, tag=True` for
//! the array form; `tag_field="type"`, `omit_defaults=True` maps for the map form).

use yoco_events::{encode_batch, Encoding, WireEvent};

const H: u64 = 0xfedc_ba98_7654_3210;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn untagged_batch() -> Vec<WireEvent> {
    vec![
        WireEvent::BlockStored {
            block_hashes: vec![1, 300, H],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4, 5, 6],
            block_size: 2,
            group_idx: None,
        },
        WireEvent::BlockRemoved {
            block_hashes: vec![H],
            group_idx: None,
        },
        WireEvent::AllBlocksCleared,
    ]
}

fn grouped_batch() -> Vec<WireEvent> {
    vec![
        WireEvent::BlockStored {
            block_hashes: vec![7],
            parent_block_hash: Some(5),
            token_ids: vec![9, 9],
            block_size: 2,
            group_idx: Some(1),
        },
        WireEvent::BlockRemoved {
            block_hashes: vec![7],
            group_idx: Some(1),
        },
    ]
}

#[test]
fn array_encoding_matches_msgspec_bytes() {
    assert_eq!(
        hex(&encode_batch(1.5, &untagged_batch(), None, Encoding::Array, "GPU")),
        "93cb3ff8000000000000939aab426c6f636b53746f7265649301cd012ccffedcba9876543210c0960102030405\
         0602c0a3475055c0c0c094ac426c6f636b52656d6f76656491cffedcba9876543210a3475055c091b0416c6c42\
         6c6f636b73436c6561726564c0"
    );
}

#[test]
fn array_encoding_with_group_and_rank_matches_msgspec_bytes() {
    assert_eq!(
        hex(&encode_batch(2.25, &grouped_batch(), Some(3), Encoding::Array, "GPU")),
        "93cb4002000000000000929aab426c6f636b53746f72656491070592090902c0a3475055c0c00194ac426c6f63\
         6b52656d6f7665649107a34750550103"
    );
}

#[test]
fn map_encoding_matches_msgspec_bytes() {
    assert_eq!(
        hex(&encode_batch(
            1.5,
            &untagged_batch(),
            None,
            Encoding::Map,
            "GPU"
        )),
        "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573930\
         1cd012ccffedcba9876543210b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473960102\
         03040506aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d\
         65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cffedcba9876543210a6\
         6d656469756da347505581a474797065b0416c6c426c6f636b73436c6561726564c0"
    );
}

#[test]
fn map_encoding_with_group_and_rank_matches_msgspec_bytes() {
    assert_eq!(
        hex(&encode_batch(2.25, &grouped_batch(), Some(3), Encoding::Map, "GPU")),
        "93cb40020000000000009289a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739107b1\
         706172656e745f626c6f636b5f6861736805a9746f6b656e5f696473920909aa626c6f636b5f73697a6502a76c\
         6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f6964780184a4747970\
         65ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739107a66d656469756da3475055a967726f75\
         705f6964780103"
    );
}
