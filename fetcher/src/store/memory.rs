//! In-memory store for unit tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use super::api::{check_key, GetObject, Store};
use crate::error::{FetchError, Result};

/// Chunk size of bodies served from memory (several chunks exercise the streaming paths).
const CHUNK: usize = 16 * 1024;

/// A bucket held in memory.
#[derive(Debug)]
pub struct MemoryStore {
    name: String,
    objects: Mutex<BTreeMap<String, Bytes>>,
}

impl MemoryStore {
    /// An empty bucket called `mem://<name>`.
    pub fn new(name: &str) -> Self {
        MemoryStore {
            name: format!("mem://{name}"),
            objects: Mutex::new(BTreeMap::new()),
        }
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        // A panic while holding the lock cannot leave the map half-updated (single insert/remove).
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn name(&self) -> &str {
        &self.name
    }

    async fn get(&self, key: &str) -> Result<GetObject> {
        check_key(&self.name, key)?;
        let data = self
            .objects()
            .get(key)
            .cloned()
            .ok_or_else(|| FetchError::NotFound {
                bucket: self.name.clone(),
                key: key.to_owned(),
            })?;
        let size = data.len() as u64;
        let chunks: Vec<Result<Bytes>> = (0..data.len())
            .step_by(CHUNK)
            .map(|i| Ok(data.slice(i..(i + CHUNK).min(data.len()))))
            .collect();
        Ok(GetObject {
            size: Some(size),
            body: Box::pin(futures::stream::iter(chunks)),
        })
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        check_key(&self.name, key)?;
        self.objects().insert(key.to_owned(), data);
        Ok(())
    }

    async fn head(&self, key: &str) -> Result<Option<u64>> {
        check_key(&self.name, key)?;
        Ok(self.objects().get(key).map(|b| b.len() as u64))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        check_key(&self.name, key)?;
        self.objects().remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .objects()
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect())
    }
}
