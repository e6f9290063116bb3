//! Golden bytes of everything a replica writes to disk or sends to a peer:
//! Raft log entries and their metadata, the state machine's metadata, the
//! snapshot blob, the acknowledgement mark, and the Raft messages between
//! replicas. docs/FORMATS.md describes each format and the rules for
//! changing one.
//!
//! These bytes outlive builds: a replica reads what an older build wrote,
//! and replicas of two builds talk to each other during a rolling upgrade.
//! Every test below writes with today's code and compares byte for byte,
//! and reads the literal bytes back. A change of these bytes is a format
//! change: bump FORMAT_VERSION and add a migration or refuse old data.
//!
//! Most values are `latchkey_core::codec` (a version byte, then bincode 2's
//! standard configuration: unsigned integers as varints, a byte below 251
//! standing for itself, `0xfb` + u16, `0xfc` + u32, `0xfd` + u64, all
//! little-endian; enum variants and lengths as varints; `Option` as a 0/1
//! tag). Several shapes here are openraft's serde derives (log ids,
//! votes, memberships, entries, messages), so an openraft upgrade can change
//! these bytes too; these tests are how it would be noticed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::path::Path;

use common::*;
use latchkey_core::codec::{self, FORMAT_VERSION};
use latchkey_core::{Outcome, Query, Store, Versioned};
use latchkey_storage::types::{
    Entry, LogId, Membership, SnapshotMeta, StoredMembership, Vote, VoteWire,
};
use latchkey_storage::{ack_mark, open, MarkRecord, Member, StorageOptions, TypeConfig, MARK_FILE};
use openraft::raft::AppendEntriesRequest;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use rocksdb::{ColumnFamilyDescriptor, Options, DB};

// ---------------------------------------------------------------- helpers

/// Bytes from hex. Whitespace and `#` comments (to the end of the line)
/// are ignored, so literals can be laid out and explained field by field.
fn unhex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .lines()
        .flat_map(|line| line.split('#').next().unwrap_or("").bytes())
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    assert!(
        digits.len().is_multiple_of(2),
        "odd number of hex digits in {s:?}"
    );
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).expect("ascii");
            u8::from_str_radix(pair, 16).unwrap_or_else(|_| panic!("not hex: {pair:?}"))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `actual` must be the golden bytes `expected` (hex).
#[track_caller]
fn assert_golden(what: &str, actual: &[u8], expected: &str) {
    assert_eq!(
        hex(actual),
        hex(&unhex(expected)),
        "{what}: the bytes changed. This is a format change: bump FORMAT_VERSION and add a \
         migration or refuse old data (see docs/FORMATS.md)"
    );
}

/// bincode 2's varint of `n` (standard configuration): the spec the
/// golden bytes follow, for the few values a test cannot fix in advance.
fn varint(n: u64) -> Vec<u8> {
    match n {
        0..=250 => vec![n as u8],
        251..=0xffff => [&[0xfb][..], &(n as u16).to_le_bytes()].concat(),
        0x1_0000..=0xffff_ffff => [&[0xfc][..], &(n as u32).to_le_bytes()].concat(),
        _ => [&[0xfd][..], &n.to_le_bytes()].concat(),
    }
}

/// A three-node membership: voters 1 and 2, learner 3, each with the
/// incarnation of its data directory.
fn members() -> Membership {
    let voters: BTreeSet<u64> = [1, 2].into();
    let nodes: BTreeMap<u64, Member> = [
        (1, Member::new("10.0.0.1:7201", "10.0.0.1:7101", 11)),
        (2, Member::new("10.0.0.2:7201", "10.0.0.2:7101", 22)),
        (3, Member::new("10.0.0.3:7201", "10.0.0.3:7101", 300)),
    ]
    .into();
    Membership::new(vec![voters], nodes).expect("a valid membership")
}

/// Entry 7 (term 3, leader 1): a put of `k` = `v` stamped at leader time 1000.
fn normal_entry() -> Entry {
    command(3, 7, 1000, put("k", "v"))
}

/// Entry 8 (term 3, leader 1): the membership of [`members`].
fn membership_entry() -> Entry {
    Entry {
        log_id: log_id(3, 8),
        payload: EntryPayload::Membership(members()),
    }
}

/// Entry 9 (term 3, leader 1): a blank entry (a new leader's first).
fn blank_entry() -> Entry {
    blank(3, 9)
}

// Log id (3, 1, 7): leader id {term 3, node 1}, index 7.
const LOG_ID_3_1_7: &str = "03 01 07";

/// codec(entry 7).
const NORMAL_ENTRY: &str = "
    0c              # FORMAT_VERSION
    03 01 07        # log id: term 3, node 1, index 7
    01              # EntryPayload::Normal
    fb e803         # Request.now = 1000 (varint u16)
    00              # Command::Put
    01 6b 01 76     # key \"k\", value \"v\" (length, bytes)
";

/// codec(entry 8).
const MEMBERSHIP_ENTRY: &str = "
    0c              # FORMAT_VERSION
    03 01 08        # log id: term 3, node 1, index 8
    02              # EntryPayload::Membership
    01 02 01 02     # configs: one config, voters {1, 2}
    03              # nodes: 3 (a node outside every config is a learner)
    01 0d 31302e302e302e313a37323031          # 1: Member { peer_addr \"10.0.0.1:7201\",
       0d 31302e302e302e313a37313031  0b      #   client_addr \"10.0.0.1:7101\", incarnation 11 }
    02 0d 31302e302e302e323a37323031          # 2: Member { \"10.0.0.2:7201\",
       0d 31302e302e302e323a37313031  16      #   \"10.0.0.2:7101\", 22 }
    03 0d 31302e302e302e333a37323031          # 3: Member { \"10.0.0.3:7201\",
       0d 31302e302e302e333a37313031  fb2c01  #   \"10.0.0.3:7101\", 300 (varint u16) }
";

/// codec(entry 9).
const BLANK_ENTRY: &str = "
    0c
    03 01 09        # log id
    00              # EntryPayload::Blank
";

// ---------------------------------------------------------------- log entries

/// Log entries as the `log` column family stores them and AppendEntries
/// carries them: codec(`openraft::Entry<TypeConfig>`), with a normal
/// request, a membership (members carry their data directory's
/// incarnation, since format version 2) and a blank entry.
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data.
#[test]
fn log_entries_are_frozen() {
    assert_eq!(FORMAT_VERSION, 12);
    let cases = [
        ("normal entry", normal_entry(), NORMAL_ENTRY),
        ("membership entry", membership_entry(), MEMBERSHIP_ENTRY),
        ("blank entry", blank_entry(), BLANK_ENTRY),
    ];
    for (what, entry, golden) in cases {
        let bytes = codec::encode(&entry).expect("encodes");
        assert_golden(what, &bytes, golden);
        let back: Entry = codec::decode(&unhex(golden)).expect("golden bytes decode");
        assert_eq!(back, entry, "{what}");
    }
    // The log id alone (in votes, snapshot metas, the state machine's meta).
    let id = codec::encode(&log_id(3, 7)).expect("encodes");
    assert_golden("log id", &id[1..], LOG_ID_3_1_7);
}

// ---------------------------------------------------------------- on disk

/// Open the closed store's RocksDB instance in `dir` as it is on disk.
fn raw_db(dir: &Path) -> DB {
    let cfs = ["log", "log_meta", "sm_data", "sm_meta"]
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    DB::open_cf_descriptors(&Options::default(), dir.join("db"), cfs).expect("opens")
}

fn raw(db: &DB, cf: &str, key: &[u8]) -> Vec<u8> {
    let handle = db.cf_handle(cf).expect("column family");
    db.get_cf(handle, key)
        .expect("reads")
        .unwrap_or_else(|| panic!("no {cf} row {key:?}"))
}

/// codec(`Vote`) of a committed vote for leader 1 in term 3.
const VOTE: &str = "
    0c              # FORMAT_VERSION
    03 01           # leader id: term 3, node 1
    01              # committed: true
";
/// codec(`Option<LogId>`): the committed log id (3, 1, 8).
const COMMITTED: &str = "
    0c
    01 03 01 08     # Some(log id (3, 1, 8))
";
/// codec(`LogId`) of the last applied entry (3, 1, 8).
const LAST_APPLIED: &str = "
    0c
    03 01 08        # log id (3, 1, 8)
";
/// codec(`StoredMembership`): entry 8's membership.
const STORED_MEMBERSHIP: &str = "
    0c
    01 03 01 08     # log id of the entry that introduced it: Some((3, 1, 8))
    01 02 01 02     # configs
    03              # nodes, as in the membership entry
    01 0d 31302e302e302e313a37323031
       0d 31302e302e302e313a37313031  0b
    02 0d 31302e302e302e323a37323031
       0d 31302e302e302e323a37313031  16
    03 0d 31302e302e302e333a37323031
       0d 31302e302e302e333a37313031  fb2c01
";

/// Where a replica keeps the log and the state machine's metadata, and in
/// which encoding: `log` rows keyed by the big-endian index holding the
/// entries' golden bytes above; `log_meta` `vote` and `committed`;
/// `sm_meta` `last_applied` and `membership`; `sm_data` the core's keyspace
/// byte for byte (the core's records are pinned in latchkey-core's
/// `golden_records` test).
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data.
#[test]
fn the_log_and_the_state_machine_are_stored_as_pinned() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let vote = Vote::new_committed(3, 1);
        log.save_vote(&vote).await.unwrap();
        log.blocking_append([normal_entry(), membership_entry(), blank_entry()])
            .await
            .unwrap();
        log.save_committed(Some(log_id(3, 8))).await.unwrap();
        sm.apply_entries([normal_entry(), membership_entry()])
            .await
            .unwrap();
    });
    let db = raw_db(dir.path());
    for (index, golden) in [
        (7u64, NORMAL_ENTRY),
        (8, MEMBERSHIP_ENTRY),
        (9, BLANK_ENTRY),
    ] {
        assert_golden(
            &format!("log row {index}"),
            &raw(&db, "log", &index.to_be_bytes()),
            golden,
        );
    }
    assert_golden("vote", &raw(&db, "log_meta", b"vote"), VOTE);
    assert_golden("committed", &raw(&db, "log_meta", b"committed"), COMMITTED);
    assert_golden(
        "last applied",
        &raw(&db, "sm_meta", b"last_applied"),
        LAST_APPLIED,
    );
    assert_golden(
        "membership",
        &raw(&db, "sm_meta", b"membership"),
        STORED_MEMBERSHIP,
    );
    let data = db.cf_handle("sm_data").unwrap();
    let rows: Vec<(Vec<u8>, Vec<u8>)> = db
        .iterator_cf(data, rocksdb::IteratorMode::Start)
        .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
        .collect();
    assert_eq!(
        rows,
        vec![
            (b"Dk".to_vec(), data_row_v()),
            (b"Mhist".to_vec(), history_cell()),
            (b"Mnow".to_vec(), 1000u64.to_be_bytes().to_vec()),
            (b"Mrev".to_vec(), 1u64.to_be_bytes().to_vec()),
            (history_key(), history_record()),
        ],
        "sm_data holds the core's keyspace as is"
    );

    // And the golden bytes read back as the values they stand for.
    let decoded: Vote = codec::decode(&unhex(VOTE)).unwrap();
    assert_eq!(decoded, Vote::new_committed(3, 1));
    let decoded: Option<LogId> = codec::decode(&unhex(COMMITTED)).unwrap();
    assert_eq!(decoded, Some(log_id(3, 8)));
    let decoded: LogId = codec::decode(&unhex(LAST_APPLIED)).unwrap();
    assert_eq!(decoded, log_id(3, 8));
    let decoded: StoredMembership = codec::decode(&unhex(STORED_MEMBERSHIP)).unwrap();
    assert_eq!(
        decoded,
        StoredMembership::new(Some(log_id(3, 8)), members())
    );
}

// ---------------------------------------------------------------- snapshots

/// The snapshot blob of the state after entries 7 and 8, with snapshot id
/// `3-1-8-0`:
///
/// ```text
/// blob  = "LKSNAP01" frame* checksum (u64 big-endian, FNV-1a 64 of all bytes before it)
/// frame = length (u32 big-endian) codec(Frame)
/// Frame = Header { meta } (variant 0) | Rows(Vec<(key, value)>) (1) | End { rows } (2)
/// ```
const SNAPSHOT: &str = "
    4c4b534e41503031            # magic \"LKSNAP01\"
    00000073                    # header frame: 115 bytes
      0c 00                     #   version, Frame::Header
      01 03 01 08               #   meta.last_log_id: Some((3, 1, 8))
      01 03 01 08               #   meta.last_membership: log id Some((3, 1, 8)),
      01 02 01 02  03           #     configs, 3 nodes:
      01 0d 31302e302e302e313a37323031
         0d 31302e302e302e313a37313031  0b
      02 0d 31302e302e302e323a37323031
         0d 31302e302e302e323a37313031  16
      03 0d 31302e302e302e333a37323031
         0d 31302e302e302e333a37313031  fb2c01
      07 332d312d382d30         #   meta.snapshot_id: \"3-1-8-0\"
    00000073                    # rows frame: 115 bytes
      0c 01                     #   version, Frame::Rows
      05                        #   5 rows, keys ascending:
      02 446b  21               #   \"Dk\" = 33 bytes: create revision 1, mod revision 1,
         0000000000000001 0000000000000001 0000000000000001  # version 1,
         0000000000000000 76    #   bound to no session, \"v\"
      05 4d68697374  10         #   \"Mhist\" = 16 bytes: the history keeps revision 1 on,
         0000000000000001 000000000000000d  # 13 bytes of records
      04 4d6e6f77  08 00000000000003e8  # \"Mnow\" = 1000 (u64 big-endian)
      04 4d726576  08 0000000000000001  # \"Mrev\" = 1 (u64 big-endian)
      09 570000000000000001  0d #   \"W\" + revision 1 = 13 bytes: codec(Record {
         0c 01 01 01 6b         #     revision 1, 1 change: key \"k\",
         01 01 76 01 01 01 00   #     current Some(\"v\", 1, 1, 1), previous None,
         00                     #     previous_dropped false })
    00000003                    # end frame: 3 bytes
      0c 02 05                  #   version, Frame::End, rows: 5
    57ad664409fa0ae5            # FNV-1a 64 of everything above, big-endian
";

/// codec(Frame::Header { meta }) up to the snapshot id, the meta's last
/// field: last log id (3, 1, 8), membership of entry 8.
const SNAPSHOT_HEADER_BEFORE_ID: &str = "
    0c 00
    01 03 01 08
    01 03 01 08  01 02 01 02  03
    01 0d 31302e302e302e313a37323031
       0d 31302e302e302e313a37313031  0b
    02 0d 31302e302e302e323a37323031
       0d 31302e302e302e323a37313031  16
    03 0d 31302e302e302e333a37323031
       0d 31302e302e302e333a37313031  fb2c01
";
/// codec(Frame::Rows([("Dk", the row of "v" at revision 1), ("Mhist",
/// oldest 1 and 13 bytes), ("Mnow", 1000 big-endian), ("Mrev", 1
/// big-endian), ("W" + revision 1, the record of the put)])).
const SNAPSHOT_ROWS: &str = "0c 01 05  02 446b 21
    0000000000000001 0000000000000001 0000000000000001 0000000000000000 76
    05 4d68697374 10 0000000000000001 000000000000000d
    04 4d6e6f77 08 00000000000003e8  04 4d726576 08 0000000000000001
    09 570000000000000001 0d 0c 01 01 01 6b 01 01 76 01 01 01 00 00";
/// codec(Frame::End { rows: 5 }).
const SNAPSHOT_END: &str = "0c 02 05";

/// The data row of "k" = "v" put at revision 1: create revision 1, mod
/// revision 1, version 1, bound to no session (u64 big-endian each), then
/// the value.
fn data_row_v() -> Vec<u8> {
    [
        1u64.to_be_bytes().as_slice(),
        &1u64.to_be_bytes(),
        &1u64.to_be_bytes(),
        &0u64.to_be_bytes(),
        b"v",
    ]
    .concat()
}

/// The watch history's cell after the put: it keeps revision 1 on, and 13
/// bytes of records.
fn history_cell() -> Vec<u8> {
    [1u64.to_be_bytes(), 13u64.to_be_bytes()].concat()
}

/// `W` + revision 1.
fn history_key() -> Vec<u8> {
    [b"W".as_slice(), &1u64.to_be_bytes()].concat()
}

/// codec(Record { revision 1, [k: None -> Some("v", 1, 1, 1)], false }).
fn history_record() -> Vec<u8> {
    unhex("0c 01 01 01 6b 01 01 76 01 01 01 00 00")
}

/// FNV-1a, 64 bit, as the blob's trailer.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A blob from its pinned pieces, with `id` as the snapshot id (openraft 0.9
/// wrote one; 0.10 writes it empty and ignores it on reading).
fn snapshot_blob(id: &str) -> Vec<u8> {
    let mut header = unhex(SNAPSHOT_HEADER_BEFORE_ID);
    header.extend(varint(id.len() as u64));
    header.extend_from_slice(id.as_bytes());
    let mut blob = b"LKSNAP01".to_vec();
    for frame in [header, unhex(SNAPSHOT_ROWS), unhex(SNAPSHOT_END)] {
        blob.extend_from_slice(&(frame.len() as u32).to_be_bytes());
        blob.extend_from_slice(&frame);
    }
    let sum = fnv1a(&blob);
    blob.extend_from_slice(&sum.to_be_bytes());
    blob
}

fn snapshot_meta() -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(3, 8)),
        last_membership: StoredMembership::new(Some(log_id(3, 8)), members()),
    }
}

/// A snapshot built today is the pinned blob (its id, which holds the build
/// time, aside): header, rows, end frame, checksum.
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data. (A change of the framing around the
/// codec values, rather than of the values, is marked by the blob's magic,
/// `LKSNAP01`, instead.)
#[test]
fn snapshots_are_built_in_the_pinned_format() {
    assert_golden("snapshot pieces", &snapshot_blob("3-1-8-0"), SNAPSHOT);
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (_log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        sm.apply_entries([normal_entry(), membership_entry()])
            .await
            .unwrap();
        let mut snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let built = snapshot_bytes(&mut snap).await;
        assert_eq!(snap.meta, snapshot_meta());
        // Since openraft 0.10 the third field of the header's meta (a
        // snapshot id in 0.9) is written empty.
        assert_golden("built snapshot", &built, &hex(&snapshot_blob("")));
        // The current snapshot file holds the same blob.
        let on_disk = std::fs::read(dir.path().join("snapshots/current.snap")).unwrap();
        assert_eq!(hex(&on_disk), hex(&built));
    });
}

/// A blob in the pinned format (as an older build wrote it) installs: the
/// state, the applied log id and the membership come back, and it becomes
/// the current snapshot.
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data. (A change of the framing around the
/// codec values, rather than of the values, is marked by the blob's magic,
/// `LKSNAP01`, instead.)
#[test]
fn a_pinned_snapshot_blob_installs() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (_log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let meta = snapshot_meta();
        receive_and_install(&mut sm, &meta, &unhex(SNAPSHOT))
            .await
            .unwrap();
        let reader = sm.reader();
        assert_eq!(
            reader.query(&Query::Get { key: b"k".to_vec() }).unwrap(),
            Ok(Outcome::Value {
                value: Some(Versioned {
                    value: b"v".to_vec(),
                    create_revision: 1,
                    mod_revision: 1,
                    version: 1
                }),
                revision: 1
            })
        );
        assert_eq!(
            reader
                .scan(Bound::Unbounded, Bound::Unbounded, false, usize::MAX)
                .unwrap(),
            vec![
                (b"Dk".to_vec(), data_row_v()),
                (b"Mhist".to_vec(), history_cell()),
                (b"Mnow".to_vec(), 1000u64.to_be_bytes().to_vec()),
                (b"Mrev".to_vec(), 1u64.to_be_bytes().to_vec()),
                (history_key(), history_record()),
            ]
        );
        let (applied, membership) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(3, 8)));
        assert_eq!(
            membership,
            StoredMembership::new(Some(log_id(3, 8)), members())
        );
        let mut current = sm.get_current_snapshot().await.unwrap().expect("installed");
        assert_eq!(current.meta, meta);
        assert_eq!(
            hex(&snapshot_bytes(&mut current).await),
            hex(&unhex(SNAPSHOT))
        );
    });
}

// ---------------------------------------------------------------- the mark

/// One slot of `acknowledged.mark`, 512 bytes at offset 0 or 4096:
///
/// ```text
/// "LKMARK01"  seq (u64 LE)  length (u32 LE)  codec(MarkRecord)  CRC-32 (LE) of all before it  zeros
/// ```
///
/// Slot with sequence 1: incarnation 0x1122334455667788, a committed vote
/// for leader 2 in term 3, log index 10, floor 7.
const MARK_SLOT_1: &str = "
    4c4b4d41524b3031        # magic \"LKMARK01\"
    0100000000000000        # seq 1 (u64 little-endian)
    10000000                # payload: 16 bytes (u32 little-endian)
    0c                      # codec(MarkRecord): FORMAT_VERSION
    fd 8877665544332211     #   incarnation (varint u64, little-endian)
    01 03 02 01             #   vote: Some({ term 3, node 2, committed })
    0a                      #   log_index 10
    07                      #   floor 7
    d99a4ae7                # CRC-32 (little-endian)
";
/// Slot with sequence 2: the same directory, log index 12, floor 12.
const MARK_SLOT_2: &str = "
    4c4b4d41524b3031
    0200000000000000        # seq 2
    10000000
    0c fd 8877665544332211 01 03 02 01
    0c                      # log_index 12
    0c                      # floor 12
    f0e31c24
";

fn mark_record(log_index: u64, floor: u64) -> MarkRecord {
    MarkRecord {
        incarnation: 0x1122_3344_5566_7788,
        vote: Some(Vote::new_committed(3, 2)),
        log_index,
        floor,
    }
}

/// A slot from its golden (unpadded) bytes: padded to 512 bytes.
fn slot(golden: &str) -> Vec<u8> {
    let mut bytes = unhex(golden);
    assert!(bytes.len() <= 512);
    bytes.resize(512, 0);
    bytes
}

/// `ack_mark::read` of a mark file built by hand from the pinned slot
/// layout: the newest valid slot wins, a damaged one is passed over.
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data. (A change of the slot layout around the
/// codec record, rather than of the record, is marked by the slot's magic,
/// `LKMARK01`, instead.)
#[test]
fn a_hand_built_mark_file_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(MARK_FILE);
    // Sequence 1 in slot 0, sequence 2 in slot 1 (offset 4096).
    let mut file = slot(MARK_SLOT_1);
    file.resize(4096, 0);
    file.extend(slot(MARK_SLOT_2));
    std::fs::write(&path, &file).unwrap();
    assert_eq!(
        ack_mark::read(dir.path()).unwrap(),
        Some(mark_record(12, 12))
    );

    // The newer slot torn (a byte of its payload flipped, so its CRC fails):
    // the older one is read.
    let mut torn = file.clone();
    torn[4096 + 24] ^= 0x01;
    std::fs::write(&path, &torn).unwrap();
    assert_eq!(
        ack_mark::read(dir.path()).unwrap(),
        Some(mark_record(10, 7))
    );

    // The slots' places do not matter, only their sequence numbers.
    let mut swapped = slot(MARK_SLOT_2);
    swapped.resize(4096, 0);
    swapped.extend(slot(MARK_SLOT_1));
    std::fs::write(&path, &swapped).unwrap();
    assert_eq!(
        ack_mark::read(dir.path()).unwrap(),
        Some(mark_record(12, 12))
    );

    // The CRC is CRC-32 (IEEE) of magic, sequence, length and payload.
    let one = unhex(MARK_SLOT_1);
    let (covered, crc) = one.split_at(one.len() - 4);
    assert_eq!(crc32fast::hash(covered).to_le_bytes(), crc);
}

/// What a replica writes in its mark follows the same layout (its
/// incarnation is random, so the record's bytes are spelled out from the
/// varint rule rather than fixed).
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data. (A change of the slot layout around the
/// codec record, rather than of the record, is marked by the slot's magic,
/// `LKMARK01`, instead.)
#[test]
fn the_mark_is_written_in_the_pinned_layout() {
    let dir = tempfile::tempdir().unwrap();
    let incarnation = runtime().block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        log.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        for index in 1..=10 {
            log.blocking_append([blank(3, index)]).await.unwrap();
        }
        log.incarnation()
    });
    let record = ack_mark::read(dir.path()).unwrap().expect("a mark");
    assert_eq!(
        record,
        MarkRecord {
            incarnation,
            vote: Some(Vote::new_committed(3, 2)),
            log_index: 10,
            floor: 10,
        }
    );
    let file = std::fs::read(dir.path().join(MARK_FILE)).unwrap();
    assert_eq!(file.len(), 4096 + 512, "two slots");
    // codec(MarkRecord): version, incarnation, Some(vote), log index, floor.
    let mut payload = vec![FORMAT_VERSION];
    payload.extend(varint(incarnation));
    payload.extend(unhex(MARK_VOTE_3_2));
    payload.extend(varint(10));
    payload.extend(varint(10));
    // The newest slot holds it; which slot that is depends on how many
    // writes it took, so find it by its sequence number.
    let newest = [0usize, 4096]
        .into_iter()
        .max_by_key(|&at| u64::from_le_bytes(file[at + 8..at + 16].try_into().unwrap()))
        .unwrap();
    let slot = &file[newest..newest + 512];
    let len = payload.len();
    assert_eq!(&slot[..8], b"LKMARK01");
    assert_eq!(&slot[16..20], &(len as u32).to_le_bytes(), "payload length");
    assert_eq!(hex(&slot[20..20 + len]), hex(&payload));
    assert_eq!(
        &slot[20 + len..24 + len],
        &crc32fast::hash(&slot[..20 + len]).to_le_bytes()
    );
    assert!(slot[24 + len..].iter().all(|&b| b == 0), "zero padding");
}

/// `Some(vote)` inside a mark record: a committed vote for leader 2 in term 3.
const MARK_VOTE_3_2: &str = "01 03 02 01";

// ---------------------------------------------------------------- peers

/// codec(VoteRequest): candidate 2 in term 4, last log id (3, 1, 9).
const VOTE_REQUEST: &str = "
    0c
    04 02 00        # vote: term 4, node 2, not committed
    01 03 01 09     # last_log_id: Some((3, 1, 9))
";
/// codec(AppendEntriesRequest): leader 1 in term 3, after (3, 1, 6),
/// entries 7 and 8, committed up to 6.
const APPEND_ENTRIES: &str = "
    0c
    03 01 01        # vote: term 3, node 1, committed
    01 03 01 06     # prev_log_id: Some((3, 1, 6))
    02              # 2 entries:
    03 01 07  01 fbe803 00 01 6b 01 76      # entry 7, as NORMAL_ENTRY
    03 01 08                                # entry 8, as MEMBERSHIP_ENTRY
    02  01 02 01 02  03
    01 0d 31302e302e302e313a37323031
       0d 31302e302e302e313a37313031  0b
    02 0d 31302e302e302e323a37323031
       0d 31302e302e302e323a37313031  16
    03 0d 31302e302e302e333a37323031
       0d 31302e302e302e333a37313031  fb2c01
    01 03 01 06     # leader_commit: Some((3, 1, 6))
";

/// The payloads replicas send each other (`RaftMessage.payload`): a rolling
/// upgrade has replicas of two builds exchange them.
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data.
#[test]
fn raft_messages_are_frozen() {
    let vote = VoteWire {
        vote: Vote::new(4, 2),
        last_log_id: Some(log_id(3, 9)),
    };
    assert_golden("vote request", &codec::encode(&vote).unwrap(), VOTE_REQUEST);
    let back: VoteWire = codec::decode(&unhex(VOTE_REQUEST)).unwrap();
    assert_eq!(back, vote);
    // openraft's request travels as this payload plus a flag beside it.
    let mut request = vote.clone().join(true);
    assert!(request.leadership_transfer);
    request.leadership_transfer = false;
    assert_eq!(VoteWire::split(request), (vote, false));

    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(3, 6)),
        entries: vec![normal_entry(), membership_entry()],
        leader_commit: Some(log_id(3, 6)),
    };
    let bytes = codec::encode(&append).unwrap();
    assert_golden("append entries", &bytes, APPEND_ENTRIES);
    let back: AppendEntriesRequest<TypeConfig> = codec::decode(&unhex(APPEND_ENTRIES)).unwrap();
    assert_eq!(back.vote, append.vote);
    assert_eq!(back.prev_log_id, append.prev_log_id);
    assert_eq!(back.entries, append.entries);
    assert_eq!(back.leader_commit, append.leader_commit);
    // The entries inside are the log's own bytes (version byte aside).
    let inner = [&unhex(NORMAL_ENTRY)[1..], &unhex(MEMBERSHIP_ENTRY)[1..]].concat();
    assert!(
        hex(&bytes).contains(&hex(&inner)),
        "AppendEntries carries the entries as the log stores them"
    );
}
