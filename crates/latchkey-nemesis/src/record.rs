//! Recording a history: each worker process appends its events, one JSON
//! line each, to a file of its own; the controller merges the files at the
//! end into one [`History`] ordered by time.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use latchkey_check::{Event, EventKind, History, Op};

use crate::clock::now_ns;
use crate::error::{Error, Result};

/// Appends events to a history file. Each event is one `write` of a whole
/// line, stamped under the lock, so the file is in time order and a process
/// killed mid-run leaves at most one torn last line (dropped at merge).
#[derive(Debug)]
pub struct Recorder {
    file: Mutex<(File, u64)>,
    path: PathBuf,
}

impl Recorder {
    /// Creates (or truncates) the history file at `path`.
    pub fn create(path: &Path) -> Result<Recorder> {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)
            .map_err(Error::io(format!("create {}", path.display())))?;
        Ok(Recorder {
            file: Mutex::new((file, 0)),
            path: path.to_path_buf(),
        })
    }

    /// Records one event of `process` now; returns its timestamp. A failed
    /// write is logged, never fatal: the run goes on, and the merge reports a
    /// gap only as a missing completion (an unknown outcome).
    pub fn record(&self, process: u64, kind: EventKind, op: Op) -> u64 {
        let mut guard = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (file, seq) = &mut *guard;
        let time_ns = now_ns();
        let event = Event {
            index: *seq,
            process,
            time_ns,
            kind,
            op,
        };
        *seq += 1;
        match serde_json::to_string(&event) {
            Ok(mut line) => {
                line.push('\n');
                if let Err(e) = file.write_all(line.as_bytes()) {
                    tracing::error!(path = %self.path.display(), %e, "cannot record an event");
                }
            }
            Err(e) => tracing::error!(%e, "cannot encode an event"),
        }
        time_ns
    }

    /// Shorthand for an invocation.
    pub fn invoke(&self, process: u64, op: Op) -> u64 {
        self.record(process, EventKind::Invoke, op)
    }
}

/// Reads one history file: its events, in file order. Only the last line
/// may be torn (its writer was killed mid-write); it is dropped. Any other
/// unreadable line is an error.
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let text =
        std::fs::read_to_string(path).map_err(Error::io(format!("read {}", path.display())))?;
    parse_events(&text).map_err(|e| Error::History(format!("{}: {e}", path.display())))
}

fn parse_events(text: &str) -> std::result::Result<Vec<Event>, String> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut events = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Event>(line) {
            Ok(e) => events.push(e),
            // The last line without its newline: a torn write.
            Err(_) if n + 1 == lines.len() => break,
            Err(e) => return Err(format!("line {}: {e}", n + 1)),
        }
    }
    Ok(events)
}

/// Merges the events of several files into one history: ordered by time,
/// ties kept in file order, renumbered from 0. Each file's own order is
/// kept for events with equal timestamps, so a process's invocation always
/// comes before its completion.
pub fn merge(files: Vec<Vec<Event>>) -> Result<History> {
    let mut all: Vec<(u64, usize, usize, Event)> = Vec::new();
    for (f, events) in files.into_iter().enumerate() {
        for (i, e) in events.into_iter().enumerate() {
            all.push((e.time_ns, f, i, e));
        }
    }
    all.sort_by_key(|(t, f, i, _)| (*t, *f, *i));
    let events: Vec<Event> = all
        .into_iter()
        .enumerate()
        .map(|(index, (_, _, _, mut e))| {
            e.index = index as u64;
            e
        })
        .collect();
    History::new(events).map_err(|e| Error::History(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_check::history::ops;

    #[test]
    fn merge_orders_by_time_and_renumbers() {
        let dir = tempfile::tempdir().unwrap();
        let a = Recorder::create(&dir.path().join("a.jsonl")).unwrap();
        let b = Recorder::create(&dir.path().join("b.jsonl")).unwrap();
        a.invoke(1, ops::write("x", "1"));
        b.invoke(2, ops::read("x", None));
        a.record(1, EventKind::Ok, ops::write("x", "1"));
        b.record(2, EventKind::Ok, ops::read("x", Some("1")));
        let files = vec![
            read_events(&dir.path().join("a.jsonl")).unwrap(),
            read_events(&dir.path().join("b.jsonl")).unwrap(),
        ];
        let h = merge(files).unwrap();
        let procs: Vec<u64> = h.events().iter().map(|e| e.process).collect();
        assert_eq!(procs, vec![1, 2, 1, 2]);
        let idx: Vec<u64> = h.events().iter().map(|e| e.index).collect();
        assert_eq!(idx, vec![0, 1, 2, 3]);
        assert_eq!(h.operations().len(), 2);
    }

    #[test]
    fn a_torn_last_line_is_dropped_but_not_a_torn_middle_one() {
        let good = r#"{"index":0,"process":1,"time_ns":5,"kind":"invoke","op":{"workload":"register","type":"read","key":"x"}}"#;
        let text = format!("{good}\n{{\"index\":1,\"proc");
        assert_eq!(parse_events(&text).unwrap().len(), 1);
        let text = format!("{{\"index\":1,\"proc\n{good}\n");
        assert!(parse_events(&text).is_err());
    }
}
