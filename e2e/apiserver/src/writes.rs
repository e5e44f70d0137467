//! A record of every write request the server answered: who sent it (identity and
//! User-Agent), what it was, when it arrived and how it was answered. Tests read it to prove
//! from the server's side what a client did, e.g. that no write of a fenced term arrived.

use std::sync::{Mutex, PoisonError};

use shardwise_e2e_testkit::WriteRecord;

/// The records, oldest first, up to a bound (the oldest are dropped beyond it).
#[derive(Debug, Default)]
pub struct WriteLog {
    records: Mutex<Vec<WriteRecord>>,
}

/// Enough for any test run; a bound so a long benchmark cannot exhaust memory.
const MAX_RECORDS: usize = 1 << 20;

impl WriteLog {
    pub(crate) fn push(&self, record: WriteRecord) {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        if records.len() == MAX_RECORDS {
            records.drain(..MAX_RECORDS / 2);
        }
        records.push(record);
    }

    /// A copy of every record kept.
    pub fn records(&self) -> Vec<WriteRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn record(n: usize) -> WriteRecord {
        WriteRecord {
            at: SystemTime::UNIX_EPOCH,
            identity: "a".into(),
            user: "a".into(),
            user_agent: None,
            method: "PATCH".into(),
            path: format!("/api/v1/namespaces/x/configmaps/{n}"),
            query: String::new(),
            code: 200,
        }
    }

    #[test]
    fn keeps_records_in_order_and_drops_the_oldest_beyond_the_bound() {
        let log = WriteLog::default();
        for n in 0..3 {
            log.push(record(n));
        }
        assert_eq!(log.records(), vec![record(0), record(1), record(2)]);
        let log = WriteLog::default();
        for n in 0..MAX_RECORDS + 1 {
            log.push(record(n));
        }
        let kept = log.records();
        assert_eq!(kept.len(), MAX_RECORDS / 2 + 1);
        assert_eq!(kept[0], record(MAX_RECORDS / 2));
        assert_eq!(kept.last(), Some(&record(MAX_RECORDS)));
    }
}
