//! Formatting and opening a pool: superblocks, drive order, journal replay.

use crate::drives::{Drive, DriveMeta, DriveSpec};
use crate::error::{ObjError, Result};
use crate::geometry::Geometry;
use crate::journal::{DriveJournal, JournalPlace, Record, ReplayStats, RECORDS_PER_PAGE};
use crate::stripe::{DriveShape, StripeMap};
use crate::superblock::{pool_name, Found, Superblock};

/// What to do with the drives' current contents.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenMode {
    /// The drives must hold a pool; anything else is an error.
    Open,
    /// Format the drives as a new, empty pool, whatever they hold.
    Create,
    /// Open the pool the drives hold; format them if every one is blank.
    OpenOrCreate,
}

/// How to open or create a pool.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub geometry: Geometry,
    pub mode: OpenMode,
    /// Pages per journal half when formatting; `None` sizes the journal from
    /// the pool's capacity (room for two snapshots plus appends).
    pub journal_pages: Option<u32>,
}

impl PoolOptions {
    pub fn new(geometry: Geometry, mode: OpenMode) -> Self {
        PoolOptions { geometry, mode, journal_pages: None }
    }
}

/// An open pool: drives in pool order, the stripe map, the journals.
pub(crate) struct Pool {
    pub id: u128,
    pub drives: Vec<Drive>,
    pub map: StripeMap,
    pub journals: Vec<DriveJournal>,
    pub replay: Vec<ReplayStats>,
    pub formatted: bool,
}

/// 64 random bits from the operating system (pool ids and journal nonces).
fn random_u64() -> Result<u64> {
    getrandom::u64().map_err(|e| ObjError::invalid("random", format!("the OS random source failed: {e}")))
}

/// Appended pages a journal half keeps free beyond two full snapshots.
const JOURNAL_SLACK_PAGES: u32 = 64;

fn place(map: &StripeMap, d: u32) -> JournalPlace {
    let r = map.drive(d);
    JournalPlace {
        drive: d,
        lba_size: r.lba_size,
        half_lba: [map.journal_half_lba(d, 0), map.journal_half_lba(d, 1)],
        half_pages: (r.journal_half_lbas * r.lba_size as u64 / crate::stripe::META_BYTES) as u32,
    }
}

impl Pool {
    pub fn open(specs: Vec<DriveSpec>, opts: &PoolOptions) -> Result<Pool> {
        opts.geometry.validate()?;
        if specs.is_empty() {
            return Err(ObjError::invalid("drives", "a pool needs at least one drive"));
        }
        let drives = specs.into_iter().map(Drive::open).collect::<Result<Vec<_>>>()?;
        if opts.mode == OpenMode::Create {
            return Self::format(drives, opts);
        }
        let found = drives
            .iter()
            .map(|d| Ok(Superblock::decode(&d.read(0, crate::stripe::META_BYTES as usize)?)))
            .collect::<Result<Vec<_>>>()?;
        if opts.mode == OpenMode::OpenOrCreate && found.iter().all(|f| *f == Found::Blank) {
            return Self::format(drives, opts);
        }
        let sb = Self::check_membership(&drives, &found)?;
        Self::open_existing(drives, opts, sb, &found)
    }

    /// Every given drive belongs to the same pool, all of it, in order.
    fn check_membership(drives: &[Drive], found: &[Found]) -> Result<Superblock> {
        let first = found.iter().find_map(|f| match f {
            Found::Valid(sb) => Some(sb.clone()),
            _ => None,
        });
        let Some(first) = first else {
            return Err(ObjError::invalid(
                "drives",
                "none of the drives holds a tutti pool (open with OpenMode::Create or OpenOrCreate to format them)",
            ));
        };
        let pool = first.pool_name();
        let perr = |what: String| ObjError::Pool { pool: pool.clone(), what };
        let order = first.serials.join(", ");
        for (i, (d, f)) in drives.iter().zip(found).enumerate() {
            match f {
                Found::Blank => {
                    return Err(perr(format!(
                        "drive {} (position {i}, serial {}) holds no tutti superblock; the pool's drives are, in order: {order}",
                        d.name(),
                        d.serial().trim()
                    )))
                }
                Found::Corrupt(why) => {
                    return Err(perr(format!("drive {} (position {i}): {why}", d.name())));
                }
                Found::Valid(sb) if sb.pool_id != first.pool_id => {
                    return Err(perr(format!(
                        "drive {} (position {i}) belongs to another pool, {}",
                        d.name(),
                        sb.pool_name()
                    )));
                }
                Found::Valid(sb) if sb.drive_index as usize != i => {
                    return Err(perr(format!(
                        "wrong drive order: drive {} at position {i} is pool drive {}; pass the drives in pool order: {order}",
                        d.name(),
                        sb.drive_index
                    )));
                }
                Found::Valid(_) => {}
            }
        }
        if first.drive_count as usize != drives.len() {
            let missing: Vec<String> = (drives.len()..first.drive_count as usize)
                .map(|i| format!("drive {i} (serial {})", first.serials.get(i).map_or("?", |s| s.as_str())))
                .collect();
            return Err(perr(format!(
                "the pool has {} drives, {} given; missing {}",
                first.drive_count,
                drives.len(),
                missing.join(", ")
            )));
        }
        Ok(first)
    }

    fn open_existing(
        drives: Vec<Drive>,
        opts: &PoolOptions,
        sb: Superblock,
        found: &[Found],
    ) -> Result<Pool> {
        let pool = sb.pool_name();
        let perr = |what: String| ObjError::Pool { pool: pool.clone(), what };
        if sb.geometry != opts.geometry {
            return Err(perr(format!(
                "formatted for {}, opened for {}: `tutti serve {}` opens it (another geometry needs \
                 other drives or another pool directory, or `--open create` to reformat, losing its contents)",
                sb.geometry,
                opts.geometry,
                sb.geometry.serve_flags()
            )));
        }
        let shapes: Vec<DriveShape> = drives.iter().map(|d| d.shape).collect();
        let map = StripeMap::new(&opts.geometry, &shapes, sb.journal_pages)?.with_files(sb.files)?;
        for (i, (d, f)) in drives.iter().zip(found).enumerate() {
            let r = map.drive(i as u32);
            // Every drive's superblock records its own LBA size and data start.
            let Found::Valid(mine) = f else {
                return Err(perr(format!("drive {}: no valid superblock", d.name())));
            };
            if mine.lba_size != r.lba_size || mine.data_start_lba != r.data_start_lba {
                return Err(perr(format!(
                    "drive {}: formatted with {}-byte LBAs and data at LBA {}, now {}-byte LBAs and data at LBA {}",
                    d.name(),
                    mine.lba_size,
                    mine.data_start_lba,
                    r.lba_size,
                    r.data_start_lba
                )));
            }
        }
        let nonce = random_u64()?;
        let mut journals = Vec::new();
        let mut replay = Vec::new();
        let mut dev = DriveMeta(&drives);
        for d in 0..drives.len() as u32 {
            let (j, stats) = DriveJournal::replay(
                &mut dev,
                place(&map, d),
                sb.pool_id as u64,
                map.drive_count(),
                map.files(),
                nonce ^ d as u64,
            )?;
            if stats.dropped_pages > 0 || stats.foreign_records > 0 {
                tracing::warn!(pool = %pool, drive = d, ?stats, "journal tail dropped");
            }
            journals.push(j);
            replay.push(stats);
        }
        tracing::info!(pool = %pool, drives = drives.len(), files = map.files(), "pool opened");
        Ok(Pool { id: sb.pool_id, drives, map, journals, replay, formatted: false })
    }

    fn format(drives: Vec<Drive>, opts: &PoolOptions) -> Result<Pool> {
        let shapes: Vec<DriveShape> = drives.iter().map(|d| d.shape).collect();
        let journal_pages = match opts.journal_pages {
            Some(p) => p,
            None => {
                let rough = StripeMap::new(&opts.geometry, &shapes, 1)?;
                let per_drive = rough.files().div_ceil(rough.drive_count());
                let snapshot = per_drive.div_ceil(RECORDS_PER_PAGE as u32).max(1);
                2 * snapshot + JOURNAL_SLACK_PAGES
            }
        };
        let map = StripeMap::new(&opts.geometry, &shapes, journal_pages)?;
        let id: u128 = (random_u64()? as u128) << 64 | random_u64()? as u128 | 1;
        let nonce = random_u64()?;
        let mut journals = Vec::new();
        {
            let mut dev = DriveMeta(&drives);
            for d in 0..drives.len() as u32 {
                journals.push(DriveJournal::format(&mut dev, place(&map, d), id as u64, nonce ^ d as u64)?);
            }
        }
        let serials: Vec<String> = drives.iter().map(|d| d.serial().trim().to_string()).collect();
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_secs());
        // Superblocks last: a pool whose format was cut short has blank drives, not a broken pool.
        for (i, d) in drives.iter().enumerate() {
            let r = map.drive(i as u32);
            let sb = Superblock {
                pool_id: id,
                drive_count: drives.len() as u32,
                drive_index: i as u32,
                geometry: opts.geometry,
                journal_pages,
                lba_size: r.lba_size,
                files: map.files(),
                slots_per_file: map.slots_per_file(),
                data_start_lba: r.data_start_lba,
                created_unix: created,
                serials: serials.clone(),
            };
            d.write(0, &sb.encode())?;
            d.flush()?;
        }
        let replay = vec![ReplayStats::default(); drives.len()];
        tracing::info!(pool = %pool_name(id), drives = drives.len(), files = map.files(), journal_pages, "pool formatted");
        Ok(Pool { id, drives, map, journals, replay, formatted: true })
    }

    pub fn name(&self) -> String {
        pool_name(self.id)
    }

    /// Every live entry of every drive's journal, oldest commit first.
    pub fn live_records(&self) -> Vec<Record> {
        let mut all: Vec<Record> = self.journals.iter().flat_map(|j| j.live().values().copied()).collect();
        all.sort_by_key(|r| (r.stamp, r.file));
        all
    }
}
