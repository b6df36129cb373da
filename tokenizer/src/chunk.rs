//! Exact incremental tokenization: provably safe cut points and a chunk cache.
//!
//! A prompt is cut into chunks at positions `p` where tokenizing the two sides separately is
//! guaranteed to give the same ids as tokenizing the whole, so the ids of a prompt are the
//! concatenation of its chunks' ids, and a chunk's ids (a pure function of its bytes) can be
//! memoised. Cuts are content-defined, so two prompts that share a prefix share their chunks
//! up to the chunk holding the first difference, and chunking re-synchronises after an edit.
//!
//! # Why a cut is exact
//!
//! The Hugging Face pipeline on a single sequence is: split at added tokens (pass 1:
//! leftmost-longest Aho-Corasick over the non-normalized added tokens; pass 2: the same over
//! the normalized ones, inside the gaps), normalize each gap (we require no normalizer),
//! pre-tokenize each gap, run the model on each pre-token independently, concatenate,
//! post-process. `Scheme::detect` only accepts configurations for which every step below
//! holds; anything else falls back to the full encode.
//!
//! 1. **Added tokens.** If no occurrence of any added token spans `p` (starts before and
//!    ends after it), the leftmost-longest scan over the whole text finds exactly the matches
//!    of the scan over `text[..p]` followed by those of `text[p..]`: every step of the scan
//!    picks, at the leftmost position holding an occurrence, the longest one, and occurrences
//!    that do not span `p` are the same in the whole text and in the side that holds them.
//!    The same holds for pass 2 inside the gap that holds `p`. This needs the added tokens to
//!    have `single_word`, `lstrip` and `rstrip` off (they look at or take in neighbouring
//!    characters) and `encode_special_tokens` off.
//! 2. **Pre-tokenization.** The two accepted pre-tokenizers split with a regex (GPT-2's
//!    `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, used by
//!    `ByteLevel` with `use_regex`, or the Llama-3 / Qwen2 pattern in a `Split` followed by a
//!    regex-free `ByteLevel`). Matches are found left to right; neither pattern has
//!    look-behind, anchors or word boundaries, so once a match ends at `p` the rest depends on
//!    `text[p..]` only. A match attempt starting before `p` behaves the same whether `text[p]`
//!    follows or the text ends at `p`, and ends at `p`, if no path through the pattern can
//!    consume `text[p-1]` and then `text[p]` (nor peek at `text[p]` with `(?!\S)`, which only
//!    follows `\s+`): then every atom that reaches `p` fails on both. Checking each
//!    alternative, that holds for the pairs (`prev`, `next`) that `pair_ok` accepts:
//!    * `prev` not whitespace, `next` one of `' '`, `'\n'`, `'\t'` (GPT-2) or `' '` (Llama-3:
//!      its ` ?[^\s\p{L}\p{N}]+[\r\n]*` would take a newline after punctuation): only `\s`
//!      atoms take whitespace after a first character, and they cannot have taken `prev`;
//!      an optional leading space (` ?`, `[^\r\n\p{L}\p{N}]?`) is always a first atom.
//!    * `prev` a letter (ASCII, CJK ideograph, kana, Hangul syllable), `next` one of a few
//!      ASCII and CJK punctuation marks (neither letter, digit nor whitespace): `\p{L}+` stops
//!      at `next` as at the end, the contractions end with letters, and no class that takes
//!      punctuation can have taken `prev`.
//!
//!    A cut where a non-normalized added token starts (and no added token spans it) is a
//!    split of step 1's pass 1 already: the scan reaches `p` without a match across it, and
//!    the leftmost occurrence from there is the one at `p`.
//! 3. **Model.** BPE without dropout: the ids of a pre-token depend on that pre-token only.
//! 4. **Post-processing** only adds special tokens around the sequence (`TemplateProcessing`)
//!    or changes offsets (`ByteLevel`); chunks are encoded without special tokens and the
//!    processor is applied once to the concatenation, shaped as `encode_fast` shapes it.
//!
//! 5. **Regex limits.** `tokenizers` stops splitting a segment when a regex match attempt
//!    exceeds fancy-regex's backtracking limit, which pre-tokens of about a million characters
//!    do; a match attempt never reads past a cut, so prompts whose chunks are all shorter than
//!    [`MAX_SAFE_CHUNK`] never reach it, and the others are encoded whole.
//!
//! Cuts only ever use these rules, so the chunked ids are exact by construction; the first
//! few chunked encodes are still compared with a full encode as a safety net.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::Value;
use tokenizers::{ModelWrapper, Tokenizer};

/// A chunk is at least this long (bytes) unless the text ends.
pub const MIN_CHUNK: usize = 256;
/// Past this length a chunk ends at the first valid cut, whatever the content hash says.
pub const MAX_CHUNK: usize = 2048;
/// Prompts with a chunk longer than this (a stretch without any valid cut) are encoded whole:
/// such a stretch may hold a pre-token long enough (about a million characters) to exceed the
/// regex engine's backtracking limit, after which `tokenizers` leaves the rest of that
/// segment unsplit, which chunks could not reproduce. Below it every regex match attempt
/// stays more than ten times under the limit.
pub const MAX_SAFE_CHUNK: usize = 64 * 1024;
/// Default byte budget of the chunk cache (texts, ids and bookkeeping).
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Accounting overhead per cache entry (map slot, queue node, allocation headers).
const ENTRY_OVERHEAD: usize = 128;
/// A valid cut past [`MIN_CHUNK`] is taken when the hash of the 8 bytes before it has its top
/// bits clear: one candidate in 16.
const CDC_SHIFT: u32 = 60;
/// Added tokens (total bytes) beyond which cuts at added tokens are not tried (the spanning
/// check would cost too much per cut); whitespace and punctuation cuts still apply.
const MAX_TOKEN_CUT_BYTES: usize = 16 * 1024;
/// Inner offsets of added tokens where a whitespace or punctuation cut could fall beyond
/// which the scheme is off (each such cut checks them all).
const MAX_RISKY: usize = 4096;

/// The Llama-3 pre-tokenization regex (also used by many later byte-level BPE models).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's variant (single digits).
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Which pre-tokenization regex the tokenizer splits with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PreTok {
    /// `ByteLevel { use_regex: true, add_prefix_space: false }`.
    Gpt2,
    /// `Sequence[Split(Llama-3 or Qwen2 regex, Isolated), ByteLevel { use_regex: false }]`.
    Llama3,
}

/// How a tokenizer's prompts are cut (built by `Scheme::detect`).
#[derive(Debug)]
pub(crate) struct Scheme {
    pretok: PreTok,
    /// Added token contents.
    tokens: Vec<Box<[u8]>>,
    /// The non-normalized added tokens (matched in pass 1), to find one starting at a byte.
    pass1: Trie,
    /// `(token, k)`: the token has a `pair_ok` pair across its byte offset `k`, so an
    /// occurrence of it could span a whitespace or punctuation cut.
    risky: Vec<(usize, usize)>,
    /// Every `(token, k)` with `k` an inner char boundary (for cuts at added tokens).
    inner: Vec<(usize, usize)>,
    /// Per byte: [`PAIR_BYTE`] if a whitespace or punctuation cut may start there,
    /// [`TOKEN_BYTE`] if a non-normalized added token starts with it (and token cuts are on).
    class: [u8; 256],
    /// The tokenizer has a post-processor (applied once to the concatenation).
    pub(crate) post_process: bool,
    /// Chunk length bounds and the content-defined cut rate (tests cut at every valid point).
    min_chunk: usize,
    max_chunk: usize,
    cdc_shift: u32,
    /// Short description, for stats.
    pub(crate) name: &'static str,
}

fn is_type(v: &Value, t: &str) -> bool {
    v.get("type").and_then(Value::as_str) == Some(t)
}

fn flag(v: &Value, k: &str) -> Option<bool> {
    v.get(k).and_then(Value::as_bool)
}

impl Scheme {
    /// The cutting scheme for `tok`, or why there is none (then prompts are encoded whole).
    pub(crate) fn detect(tok: &Tokenizer) -> Result<Scheme, &'static str> {
        if tok.get_normalizer().is_some() {
            return Err("normalizer");
        }
        if tok.get_truncation().is_some() || tok.get_padding().is_some() {
            return Err("truncation or padding");
        }
        if tok.get_encode_special_tokens() {
            return Err("encode_special_tokens");
        }
        match tok.get_model() {
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none() => {}
            _ => return Err("model is not BPE without dropout"),
        }
        let pre = serde_json::to_value(tok.get_pre_tokenizer()).unwrap_or(Value::Null);
        let byte_level = |v: &Value, regex: bool| {
            is_type(v, "ByteLevel") && flag(v, "add_prefix_space") == Some(false) && flag(v, "use_regex") == Some(regex)
        };
        let pretok = if byte_level(&pre, true) {
            PreTok::Gpt2
        } else if is_type(&pre, "Sequence")
            && let Some([split, bl]) = pre.get("pretokenizers").and_then(Value::as_array).map(Vec::as_slice)
            && is_type(split, "Split")
            && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
            && flag(split, "invert") == Some(false)
            && split
                .get("pattern")
                .and_then(|p| p.get("Regex"))
                .and_then(Value::as_str)
                .is_some_and(|r| r == LLAMA3_PATTERN || r == QWEN2_PATTERN)
            && byte_level(bl, false)
        {
            PreTok::Llama3
        } else {
            return Err("pre-tokenizer");
        };
        let post_process = match tok.get_post_processor() {
            None => false,
            Some(p) => {
                let p = serde_json::to_value(p).unwrap_or(Value::Null);
                let known = |v: &Value| is_type(v, "ByteLevel") || is_type(v, "TemplateProcessing");
                let ok = known(&p)
                    || (is_type(&p, "Sequence")
                        && p.get("processors").and_then(Value::as_array).is_some_and(|l| l.iter().all(known)));
                if !ok {
                    return Err("post-processor");
                }
                true
            }
        };
        let mut added: Vec<_> = tok.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        if added.iter().any(|(_, t)| t.single_word || t.lstrip || t.rstrip) {
            return Err("added token with single_word, lstrip or rstrip");
        }
        added.retain(|(_, t)| !t.content.is_empty());
        let mut pass1 = Trie::default();
        let mut risky = Vec::new();
        let mut inner = Vec::new();
        for (i, (_, t)) in added.iter().enumerate() {
            let s = t.content.as_str();
            // Cuts go before pass-1 (non-normalized) tokens only: a pass-2 token starting at
            // `p` need not be matched there, as a pass-1 match may cut its gap short.
            if !t.normalized {
                pass1.insert(s.as_bytes());
            }
            for (k, next) in s.char_indices().skip(1) {
                inner.push((i, k));
                if s[..k].chars().next_back().is_some_and(|prev| pair_ok(pretok, prev, next)) {
                    risky.push((i, k));
                }
            }
        }
        if risky.len() > MAX_RISKY {
            return Err("too many added tokens holding spaces or punctuation");
        }
        let tokens: Vec<Box<[u8]>> = added.into_iter().map(|(_, t)| t.content.into_bytes().into()).collect();
        let token_cuts = tokens.iter().map(|t| t.len()).sum::<usize>() <= MAX_TOKEN_CUT_BYTES;
        let mut class = [0u8; 256];
        for b in [b' ', b'\n', b'\t', b',', b'.', b';', b':', b'!', b'?', 0xE3, 0xEF] {
            class[usize::from(b)] |= PAIR_BYTE;
        }
        if token_cuts {
            for &(b, _) in &pass1.nodes[0].children {
                class[usize::from(b)] |= TOKEN_BYTE;
            }
        }
        let name = match pretok {
            PreTok::Gpt2 => "byte-level BPE, GPT-2 regex",
            PreTok::Llama3 => "byte-level BPE, Llama-3 regex",
        };
        Ok(Scheme {
            pretok,
            tokens,
            pass1,
            risky,
            inner,
            class,
            post_process,
            min_chunk: MIN_CHUNK,
            max_chunk: MAX_CHUNK,
            cdc_shift: CDC_SHIFT,
            name,
        })
    }

    /// Cuts at every valid point (exercises the cut rules as hard as possible).
    #[cfg(test)]
    pub(crate) fn cut_everywhere(mut self) -> Scheme {
        self.min_chunk = 1;
        self.max_chunk = 1;
        self.cdc_shift = 64;
        self
    }

    /// Chunk end offsets of `text` (the last is `text.len()`); `steps` counts the candidate
    /// positions examined (at most one per byte).
    pub(crate) fn cuts(&self, text: &str, steps: &mut u64) -> Vec<usize> {
        self.cuts_with(text, self.min_chunk, self.max_chunk, self.cdc_shift, steps)
    }

    /// Piece end offsets of `text` (itself a chunk, or any text starting at a valid cut), cut
    /// at the first valid cut at least `len` bytes after the previous one: pieces that small
    /// let a caller stop encoding close to where it needs to (see
    /// `EngineTokenizer::encode_prompt_leading`). Not content-defined, so not for the cache.
    pub(crate) fn fine_cuts(&self, text: &str, len: usize, steps: &mut u64) -> Vec<usize> {
        self.cuts_with(text, len.max(1), len.max(1), 0, steps)
    }

    fn cuts_with(&self, text: &str, min_chunk: usize, max_chunk: usize, cdc_shift: u32, steps: &mut u64) -> Vec<usize> {
        let b = text.as_bytes();
        let mut ends = Vec::with_capacity(b.len() / 512 + 1);
        let mut start = 0;
        let mut p = min_chunk;
        while p < b.len() {
            let class = self.class[usize::from(b[p])];
            if class != 0 {
                *steps += 1;
                // Candidate bytes are ASCII or UTF-8 lead bytes, so `p` is a char boundary.
                if (p - start >= max_chunk || content_says_cut(b, p, cdc_shift))
                    && ((class & PAIR_BYTE != 0 && self.pair_cut(text, p))
                        || (class & TOKEN_BYTE != 0 && self.token_cut(b, p)))
                {
                    ends.push(p);
                    start = p;
                    p = start + min_chunk;
                    continue;
                }
            }
            p += 1;
        }
        ends.push(b.len());
        ends
    }

    /// A whitespace or punctuation cut (rule 2) that no added token occurrence spans.
    fn pair_cut(&self, text: &str, p: usize) -> bool {
        let (Some(prev), Some(next)) = (text[..p].chars().next_back(), text[p..].chars().next()) else {
            return false;
        };
        pair_ok(self.pretok, prev, next) && !self.spanned(text.as_bytes(), p, &self.risky)
    }

    /// A cut where an added token starts and none spans.
    fn token_cut(&self, b: &[u8], p: usize) -> bool {
        self.pass1.prefix_of(&b[p..]) && !self.spanned(b, p, &self.inner)
    }

    fn spanned(&self, b: &[u8], p: usize, offsets: &[(usize, usize)]) -> bool {
        offsets.iter().any(|&(i, k)| {
            let t = &self.tokens[i];
            p >= k && b[p - k] == t[0] && b[p - k..].starts_with(t)
        })
    }
}

/// A byte trie of token contents.
#[derive(Debug, Default)]
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Default)]
struct TrieNode {
    /// Sorted by byte.
    children: Vec<(u8, usize)>,
    /// A token ends here.
    end: bool,
}

impl Trie {
    fn insert(&mut self, token: &[u8]) {
        if self.nodes.is_empty() {
            self.nodes.push(TrieNode::default());
        }
        let mut node = 0;
        for &b in token {
            node = match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(i) => self.nodes[node].children[i].1,
                Err(i) => {
                    let next = self.nodes.len();
                    self.nodes.push(TrieNode::default());
                    self.nodes[node].children.insert(i, (b, next));
                    next
                }
            };
        }
        self.nodes[node].end = true;
    }

    /// Whether some token is a prefix of `s` (at most the longest token's length of steps).
    fn prefix_of(&self, s: &[u8]) -> bool {
        let mut node = 0;
        for &b in s {
            let Some(n) = self.nodes.get(node) else { return false };
            match n.children.binary_search_by_key(&b, |c| c.0) {
                Ok(i) => node = n.children[i].1,
                Err(_) => return false,
            }
            if self.nodes[node].end {
                return true;
            }
        }
        false
    }
}

const PAIR_BYTE: u8 = 1;
const TOKEN_BYTE: u8 = 2;

/// Content-defined cut decision from the 8 bytes before `p`.
fn content_says_cut(b: &[u8], p: usize, shift: u32) -> bool {
    let mut w = [0u8; 8];
    if p >= 8 {
        w.copy_from_slice(&b[p - 8..p]);
    } else {
        w[8 - p..].copy_from_slice(&b[..p]);
    }
    let x = u64::from_le_bytes(w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9).checked_shr(shift).unwrap_or(0) == 0
}

/// Whether `prev` followed by `next` is a pair no pre-token can straddle (see the module doc).
fn pair_ok(pretok: PreTok, prev: char, next: char) -> bool {
    let ws_next = match pretok {
        PreTok::Gpt2 => matches!(next, ' ' | '\n' | '\t'),
        PreTok::Llama3 => next == ' ',
    };
    (ws_next && surely_not_space(prev)) || (surely_letter(prev) && surely_punct(next))
}

/// Not `\s` (Unicode White_Space) under any Unicode version; ASCII controls are excluded too.
fn surely_not_space(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_graphic()
    } else {
        !c.is_whitespace() && !matches!(c, '\u{180E}' | '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}')
    }
}

/// `\p{L}` (general category Letter) in every Unicode version the regex engines may use.
fn surely_letter(c: char) -> bool {
    c.is_ascii_alphabetic()
        || matches!(c, '\u{4E00}'..='\u{9FFF}' | '\u{3041}'..='\u{3096}' | '\u{30A1}'..='\u{30FA}' | '\u{AC00}'..='\u{D7A3}')
}

/// Punctuation (category P): neither `\p{L}`, `\p{N}` nor `\s`.
fn surely_punct(c: char) -> bool {
    matches!(c, ',' | '.' | ';' | ':' | '!' | '?' | '、' | '。' | '！' | '，' | '：' | '；' | '？')
}

/// A fast 64-bit hash of a chunk's bytes (keys are compared exactly on lookup).
pub(crate) fn chunk_hash(b: &[u8]) -> u64 {
    const K: u64 = 0x517C_C1B7_2722_0A95;
    let mut h = b.len() as u64;
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(a)).wrapping_mul(K);
    }
    let rest = words.remainder();
    let mut a = [0u8; 8];
    a[..rest.len()].copy_from_slice(rest);
    h = (h.rotate_left(5) ^ u64::from_le_bytes(a)).wrapping_mul(K);
    h ^ (h >> 31)
}

struct Entry {
    text: Box<str>,
    ids: Arc<[u32]>,
    /// Last use.
    used: u64,
    /// Tick of this entry's record in the eviction queue.
    queued: u64,
}

impl Entry {
    fn cost(&self) -> usize {
        self.text.len() + self.ids.len() * 4 + ENTRY_OVERHEAD
    }
}

/// Keys are already hashes: use them as they are.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A map from chunk text to ids, bounded in bytes, evicting the least recently used entries.
/// A hit only stamps its entry; the eviction order is fixed up lazily, when an entry used since
/// it was queued comes up for eviction.
pub(crate) struct ChunkCache {
    map: HashMap<u64, Entry, std::hash::BuildHasherDefault<KeyHasher>>,
    /// `tick -> key`, one live record per entry (stale ones, of replaced entries, are skipped).
    queue: BTreeMap<u64, u64>,
    tick: u64,
    pub(crate) bytes: usize,
    pub(crate) budget: usize,
    pub(crate) evictions: u64,
}

impl ChunkCache {
    pub(crate) fn new(budget: usize) -> ChunkCache {
        ChunkCache { map: HashMap::default(), queue: BTreeMap::new(), tick: 0, bytes: 0, budget, evictions: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn get(&mut self, key: u64, text: &str) -> Option<Arc<[u32]>> {
        self.tick += 1;
        let e = self.map.get_mut(&key).filter(|e| &*e.text == text)?;
        e.used = self.tick;
        Some(e.ids.clone())
    }

    pub(crate) fn insert(&mut self, key: u64, text: &str, ids: Arc<[u32]>) {
        self.tick += 1;
        let e = Entry { text: text.into(), ids, used: self.tick, queued: self.tick };
        if e.cost() > self.budget {
            return;
        }
        // A hash collision replaces the older entry (lookups compare the text, so stay exact).
        if let Some(old) = self.map.remove(&key) {
            self.bytes -= old.cost();
        }
        self.bytes += e.cost();
        self.queue.insert(e.queued, key);
        self.map.insert(key, e);
        self.evict();
    }

    /// Drops least-recently-used entries until the cache fits its budget.
    fn evict(&mut self) {
        while self.bytes > self.budget {
            let Some((tick, key)) = self.queue.pop_first() else { break };
            let Some(e) = self.map.get_mut(&key).filter(|e| e.queued == tick) else { continue };
            if e.used != tick {
                e.queued = e.used;
                self.queue.insert(e.used, key);
            } else if let Some(old) = self.map.remove(&key) {
                self.bytes -= old.cost();
                self.evictions += 1;
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.queue.clear();
        self.bytes = 0;
    }

    pub(crate) fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        self.evict();
    }
}

#[cfg(test)]
mod tests;
