//! YAML → JSON values with source positions.
//!
//! Each document becomes a `serde_json::Value` plus a map from field paths (`spec.steps[1].type`)
//! to the position of the key and of the value, so later stages can point at the exact line
//! of any field. Plain scalars follow the YAML 1.2 core schema (what `kubectl` accepts for
//! these types). Duplicate keys are errors, as in the API server's strict decoding. A syntax
//! error ends the file, but documents before it are kept.
//!
//! Aliases are expanded by copying the anchored value, so a small file can describe an
//! exponentially large tree ("billion laughs": each anchor aliases the previous one ten
//! times). Invariant: the nodes and scalar bytes the builder copies in one file — alias
//! expansions, and the copy of each anchored value kept for later aliases — never exceed
//! [`MAX_ALIAS_EXPANSION_NODES`] and [`MAX_ALIAS_EXPANSION_BYTES`]. Every value carries its
//! size as it is built, so the check happens *before* anything is copied and costs O(1). The
//! alias that would cross a limit is an error at its position, and its document is dropped (a
//! partially expanded document would only produce misleading follow-on errors). An anchored
//! value too large to keep is not kept; only an alias to it is an error.

use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::diagnostics::Pos;

/// Most nodes (mapping keys, values, sequence items) that alias expansion may produce in one
/// file. Real configurations alias a few small blocks (shared limits, label sets) a few times,
/// i.e. hundreds of nodes; this leaves two orders of magnitude of headroom while keeping the
/// worst case a few milliseconds of copying.
pub const MAX_ALIAS_EXPANSION_NODES: u64 = 100_000;
/// Most bytes of keys and scalars that alias expansion may produce in one file. Bounds the
/// other way to amplify: one huge scalar aliased many times.
pub const MAX_ALIAS_EXPANSION_BYTES: u64 = 16 << 20;

/// One parsed YAML document.
#[derive(Debug, Clone)]
pub struct Document {
    /// Index of the document in its file, from 0.
    pub index: usize,
    /// The content.
    pub value: Value,
    /// Position where the document's content starts.
    pub start: Pos,
    key_pos: BTreeMap<String, Pos>,
    value_pos: BTreeMap<String, Pos>,
}

/// A problem found while reading YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    /// Where.
    pub pos: Pos,
    /// What.
    pub message: String,
}

impl Document {
    /// Position of the field at `path`: its key if it is a mapping entry, else its value;
    /// falls back to the closest ancestor that has a position.
    pub fn pos_of(&self, path: &str) -> Pos {
        let mut p = path.to_owned();
        loop {
            if let Some(pos) = self.key_pos.get(&p).or_else(|| self.value_pos.get(&p)) {
                return *pos;
            }
            match parent_path(&p) {
                Some(parent) => p = parent,
                None => return self.start,
            }
        }
    }

    /// Position of the value at `path` (falls back like [`Document::pos_of`]).
    pub fn value_pos_of(&self, path: &str) -> Pos {
        self.value_pos.get(path).copied().unwrap_or_else(|| self.pos_of(path))
    }
}

/// The parent of a field path: `a.b[2].c` → `a.b[2]` → `a.b` → `a` → (none; root is "").
pub fn parent_path(path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    Some(path[..cut].to_owned())
}

/// Joins a mapping key onto a path.
pub fn join_key(base: &str, key: &str) -> String {
    if base.is_empty() { key.to_owned() } else { format!("{base}.{key}") }
}

/// Joins a sequence index onto a path.
pub fn join_index(base: &str, index: usize) -> String {
    format!("{base}[{index}]")
}

/// Parses every document in `text`. Returns the documents read before any syntax error, and
/// the errors (syntax, duplicate keys, unsupported constructs).
pub fn parse(text: &str) -> (Vec<Document>, Vec<YamlError>) {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    if let Err(err) = parser.load(&mut builder, true) {
        let m = err.marker();
        builder.errors.push(YamlError { pos: to_pos(m), message: err.info().to_owned() });
    }
    (builder.docs, builder.errors)
}

/// Size of a value as alias expansion counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Weight {
    nodes: u64,
    bytes: u64,
}

impl Weight {
    /// One node without text: a collection, or the null standing in for a rejected alias.
    const NODE: Weight = Weight { nodes: 1, bytes: 0 };

    fn scalar(text: &str) -> Self {
        Weight { nodes: 1, bytes: text.len() as u64 }
    }

    fn add(&mut self, other: Weight) {
        // Saturating: sizes are bounded by the limits plus the text, but never wrap.
        self.nodes = self.nodes.saturating_add(other.nodes);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

fn to_pos(m: &Marker) -> Pos {
    // yaml-rust2 markers: line from 1, column from 0.
    Pos { line: m.line().max(1) as u32, col: m.col() as u32 + 1 }
}

/// An open collection; `weight` counts the collection node and everything attached so far.
enum Frame {
    Map { map: Map<String, Value>, path: String, anchor: usize, pending_key: Option<String>, weight: Weight },
    Seq { items: Vec<Value>, path: String, anchor: usize, weight: Weight },
}

/// Open collections wait for their first scalar to learn where they start: the parser's
/// marks for block collection starts point past the first key, not at it.
struct Unplaced {
    path: String,
    fallback: Pos,
}

#[derive(Default)]
struct Builder {
    docs: Vec<Document>,
    errors: Vec<YamlError>,
    stack: Vec<Frame>,
    unplaced: Vec<Unplaced>,
    root: Option<Value>,
    /// Anchored values, or the limit keeping a copy would have crossed.
    anchors: BTreeMap<usize, Result<(Value, Weight), String>>,
    /// What the builder has copied so far in this file (all documents).
    copied: Weight,
    /// The current document hit an expansion limit and will be dropped.
    doc_over_limit: bool,
    key_pos: BTreeMap<String, Pos>,
    value_pos: BTreeMap<String, Pos>,
    doc_start: Option<Pos>,
    doc_index: usize,
}

impl Builder {
    /// Path of the next child of the innermost open collection; `None` when the next scalar
    /// in a mapping is a key.
    fn next_child_path(&self) -> Option<String> {
        match self.stack.last() {
            None => Some(String::new()),
            Some(Frame::Map { pending_key: Some(k), path, .. }) => Some(join_key(path, k)),
            Some(Frame::Map { pending_key: None, .. }) => None,
            Some(Frame::Seq { items, path, .. }) => Some(join_index(path, items.len())),
        }
    }

    /// Gives every open collection still without a position the position `pos`.
    fn place(&mut self, pos: Pos) {
        for u in self.unplaced.drain(..) {
            if u.path.is_empty() {
                self.doc_start.get_or_insert(pos);
            }
            self.value_pos.insert(u.path, pos);
        }
    }

    fn attach(&mut self, value: Value, weight: Weight) {
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some(Frame::Map { map, pending_key, weight: w, .. }) => {
                if let Some(k) = pending_key.take() {
                    w.add(weight);
                    map.insert(k, value);
                }
            }
            Some(Frame::Seq { items, weight: w, .. }) => {
                w.add(weight);
                items.push(value);
            }
        }
    }

    /// Charges a copy of `weight` to the file's budget; the limit it would cross, if any.
    fn charge(&mut self, weight: Weight) -> Result<(), String> {
        let mut total = self.copied;
        total.add(weight);
        if total.nodes > MAX_ALIAS_EXPANSION_NODES {
            return Err(format!("alias expansion exceeds {MAX_ALIAS_EXPANSION_NODES} nodes"));
        }
        if total.bytes > MAX_ALIAS_EXPANSION_BYTES {
            return Err(format!("alias expansion exceeds {MAX_ALIAS_EXPANSION_BYTES} bytes"));
        }
        self.copied = total;
        Ok(())
    }

    /// Keeps a copy of an anchored value for later aliases, if the budget allows.
    fn register_anchor(&mut self, anchor: usize, value: &Value, weight: Weight) {
        // Without this charge, nested anchors (`&a [&b [&c [...]]]`) would copy the same
        // subtree once per level.
        let kept = self.charge(weight).map(|()| (value.clone(), weight));
        self.anchors.insert(anchor, kept);
    }

    /// The value an alias stands for, if copying it stays within the budget.
    fn expand_alias(&mut self, id: usize, pos: Pos) -> (Value, Weight) {
        let charged = match self.anchors.get(&id) {
            None => {
                self.errors.push(YamlError { pos, message: "alias to an unknown anchor".to_owned() });
                return (Value::Null, Weight::NODE);
            }
            // Already reported for this document, which will be dropped: copy nothing more.
            Some(_) if self.doc_over_limit => return (Value::Null, Weight::NODE),
            // Not kept: its copy alone crossed a limit, so any alias to it does too.
            Some(Err(message)) => Err(message.clone()),
            Some(Ok((_, weight))) => {
                let weight = *weight;
                self.charge(weight).map(|()| weight)
            }
        };
        match charged {
            Ok(weight) => {
                let value = match self.anchors.get(&id) {
                    Some(Ok((value, _))) => value.clone(),
                    _ => Value::Null,
                };
                (value, weight)
            }
            Err(message) => {
                self.doc_over_limit = true;
                self.errors.push(YamlError { pos, message });
                (Value::Null, Weight::NODE)
            }
        }
    }

    fn finish_document(&mut self) {
        self.stack.clear();
        self.unplaced.clear();
        if let Some(value) = self.root.take().filter(|_| !self.doc_over_limit) {
            let start = self.doc_start.unwrap_or(Pos { line: 1, col: 1 });
            self.docs.push(Document {
                index: self.doc_index,
                value,
                start,
                key_pos: std::mem::take(&mut self.key_pos),
                value_pos: std::mem::take(&mut self.value_pos),
            });
        }
        self.key_pos.clear();
        self.value_pos.clear();
        self.anchors.clear();
        self.doc_over_limit = false;
        self.doc_start = None;
        self.doc_index += 1;
    }

    fn on_scalar(&mut self, text: String, style: TScalarStyle, anchor: usize, tag: Option<Tag>, pos: Pos) {
        self.place(pos);
        let as_key = matches!(self.stack.last(), Some(Frame::Map { pending_key: None, .. }));
        if as_key {
            let path = match self.stack.last_mut() {
                Some(Frame::Map { path, map, weight, .. }) => {
                    // The key is a node of the mapping too.
                    weight.add(Weight::scalar(&text));
                    if map.contains_key(&text) {
                        self.errors.push(YamlError { pos, message: format!("duplicate key `{text}`") });
                    }
                    join_key(path, &text)
                }
                _ => String::new(),
            };
            self.key_pos.insert(path, pos);
            if let Some(Frame::Map { pending_key, .. }) = self.stack.last_mut() {
                *pending_key = Some(text);
            }
            return;
        }
        let weight = Weight::scalar(&text);
        let value = resolve_scalar(text, style, tag.as_ref());
        if let Some(path) = self.next_child_path() {
            self.value_pos.insert(path, pos);
        }
        if anchor > 0 {
            self.register_anchor(anchor, &value, weight);
        }
        self.attach(value, weight);
    }

    fn open(&mut self, is_map: bool, anchor: usize, pos: Pos) {
        let Some(path) = self.next_child_path() else {
            self.errors
                .push(YamlError { pos, message: "complex (non-scalar) mapping keys are not supported".to_owned() });
            // Still track the structure so the parser's later events stay balanced.
            let path = "<complex-key>".to_owned();
            self.stack.push(if is_map {
                Frame::Map { map: Map::new(), path, anchor: 0, pending_key: None, weight: Weight::NODE }
            } else {
                Frame::Seq { items: Vec::new(), path, anchor: 0, weight: Weight::NODE }
            });
            return;
        };
        self.unplaced.push(Unplaced { path: path.clone(), fallback: pos });
        self.stack.push(if is_map {
            Frame::Map { map: Map::new(), path, anchor, pending_key: None, weight: Weight::NODE }
        } else {
            Frame::Seq { items: Vec::new(), path, anchor, weight: Weight::NODE }
        });
    }

    fn close(&mut self) {
        let Some(frame) = self.stack.pop() else { return };
        let (value, anchor, path, weight) = match frame {
            Frame::Map { map, anchor, path, weight, .. } => (Value::Object(map), anchor, path, weight),
            Frame::Seq { items, anchor, path, weight } => (Value::Array(items), anchor, path, weight),
        };
        if path == "<complex-key>" {
            // The key is dropped; the value that follows becomes the pending entry's value
            // and is discarded by `attach` (no pending key).
            return;
        }
        // An empty collection has no scalar to place it; use the parser's mark.
        if let Some(i) = self.unplaced.iter().position(|u| u.path == path) {
            let u = self.unplaced.remove(i);
            if u.path.is_empty() {
                self.doc_start.get_or_insert(u.fallback);
            }
            self.value_pos.insert(u.path, u.fallback);
        }
        if anchor > 0 {
            self.register_anchor(anchor, &value, weight);
        }
        self.attach(value, weight);
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let pos = to_pos(&mark);
        match ev {
            Event::DocumentStart => {
                self.doc_start = None;
            }
            Event::DocumentEnd => self.finish_document(),
            Event::Scalar(text, style, anchor, tag) => {
                if self.stack.is_empty() {
                    self.doc_start.get_or_insert(pos);
                }
                self.on_scalar(text, style, anchor, tag, pos);
            }
            Event::MappingStart(anchor, _) => self.open(true, anchor, pos),
            Event::SequenceStart(anchor, _) => self.open(false, anchor, pos),
            Event::MappingEnd | Event::SequenceEnd => self.close(),
            Event::Alias(id) => {
                self.place(pos);
                if matches!(self.stack.last(), Some(Frame::Map { pending_key: None, .. })) {
                    self.errors.push(YamlError { pos, message: "aliases cannot be used as mapping keys".to_owned() });
                    return;
                }
                let (value, weight) = self.expand_alias(id, pos);
                if let Some(path) = self.next_child_path() {
                    self.value_pos.insert(path, pos);
                }
                self.attach(value, weight);
            }
            Event::StreamStart | Event::StreamEnd | Event::Nothing => {}
        }
    }
}

/// YAML 1.2 core schema resolution for plain scalars; quoted scalars are strings.
fn resolve_scalar(text: String, style: TScalarStyle, tag: Option<&Tag>) -> Value {
    if let Some(tag) = tag
        && (tag.handle == "tag:yaml.org,2002:" || tag.handle == "!!")
        && tag.suffix == "str"
    {
        return Value::String(text);
    }
    if style != TScalarStyle::Plain {
        return Value::String(text);
    }
    match text.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let unsigned = text.strip_prefix('+').unwrap_or(&text);
    if !unsigned.is_empty()
        && unsigned.bytes().all(|b| b.is_ascii_digit())
        && let Ok(u) = unsigned.parse::<u64>()
    {
        return Value::Number(u.into());
    }
    if let Some(rest) = text.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
        && let Ok(i) = text.parse::<i64>()
    {
        return Value::Number(i.into());
    }
    if let Some(hex) = text.strip_prefix("0x")
        && let Ok(u) = u64::from_str_radix(hex, 16)
    {
        return Value::Number(u.into());
    }
    if let Some(oct) = text.strip_prefix("0o")
        && let Ok(u) = u64::from_str_radix(oct, 8)
    {
        return Value::Number(u.into());
    }
    let looks_float =
        text.bytes().any(|b| b.is_ascii_digit()) && text.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
    if looks_float && let Some(n) = text.parse::<f64>().ok().and_then(Number::from_f64) {
        return Value::Number(n);
    }
    Value::String(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_point_at_keys_and_values() {
        let text = "apiVersion: v1\nkind: X\nspec:\n  steps:\n  - type: A\n    n: 2\n  - type: B\n";
        let (docs, errs) = parse(text);
        assert!(errs.is_empty(), "{errs:?}");
        let d = &docs[0];
        assert_eq!(d.value["spec"]["steps"][1]["type"], "B");
        assert_eq!(d.value["spec"]["steps"][0]["n"], 2);
        assert_eq!(d.pos_of("spec.steps[1].type"), Pos { line: 7, col: 5 });
        assert_eq!(d.value_pos_of("spec.steps[0].n"), Pos { line: 6, col: 8 });
        assert_eq!(d.pos_of("spec.steps[0].missing"), Pos { line: 5, col: 5 });
    }

    #[test]
    fn multiple_documents_and_scalars() {
        let text = "a: 1\n---\nb: '1'\nc: 1.5\nd: true\ne: ~\nf: -3\ng: hello\n";
        let (docs, errs) = parse(text);
        assert!(errs.is_empty());
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].index, 1);
        assert_eq!(docs[1].value, serde_json::json!({"b": "1", "c": 1.5, "d": true, "e": null, "f": -3, "g": "hello"}));
        assert_eq!(docs[1].start.line, 3);
    }

    #[test]
    fn syntax_error_keeps_earlier_documents() {
        let text = "a: 1\n---\nb: [1, 2\nc: 3\n";
        let (docs, errs) = parse(text);
        assert_eq!(docs.len(), 1);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].pos.line >= 3, "{errs:?}");
    }

    #[test]
    fn duplicate_keys_and_anchors() {
        let (docs, errs) = parse("a: &x {k: 1}\nb: *x\na: 2\n");
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].pos.line, 3);
        assert_eq!(docs[0].value["b"]["k"], 1);
    }

    /// Nine levels of "each anchor aliases the previous one ten times": 10^9 nodes if expanded.
    fn billion_laughs() -> String {
        let mut text = format!("a: &a [{}]\n", ["lol"; 10].join(", "));
        for (prev, name) in ('a'..='h').zip('b'..='i') {
            let items = vec![format!("*{prev}"); 10].join(", ");
            text.push_str(&format!("{name}: &{name} [{items}]\n"));
        }
        text
    }

    #[test]
    fn billion_laughs_is_rejected_at_the_alias_that_crosses_the_limit() {
        let text = billion_laughs();
        let started = std::time::Instant::now();
        let (docs, errs) = parse(&text);
        // Unbounded, this allocates 10^9 values; bounded, it copies at most the limit.
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "took {:?}", started.elapsed());
        assert_eq!(errs.len(), 1, "one error, not one per later alias: {errs:?}");
        assert_eq!(errs[0].message, format!("alias expansion exceeds {MAX_ALIAS_EXPANSION_NODES} nodes"));
        // Copied so far: the kept anchors a, b, c, d (11 + 111 + 1 111 + 11 111) and the
        // aliases in b, c, d (110 + 1 110 + 11 110) = 24 574 nodes. Each `*d` in `e` adds
        // 11 111: six fit (91 240), the 7th (102 351 > 100 000) crosses the limit.
        assert_eq!(MAX_ALIAS_EXPANSION_NODES, 100_000, "the arithmetic above assumes this limit");
        let line_e = text.lines().nth(4).expect("line 5");
        assert!(line_e.starts_with("e: "), "{line_e}");
        let seventh = line_e.match_indices("*d").nth(6).expect("7th alias").0;
        assert_eq!(errs[0].pos, Pos { line: 5, col: seventh as u32 + 1 });
        assert!(docs.is_empty(), "the partially expanded document is dropped: {docs:?}");
    }

    #[test]
    fn one_huge_scalar_aliased_many_times_is_rejected_by_bytes() {
        let big = "x".repeat(1 << 20);
        let items = vec!["*s"; 16].join(", ");
        let text = format!("s: &s {big}\nl: [{items}]\n");
        let (docs, errs) = parse(&text);
        assert_eq!(errs.len(), 1, "{:?}", errs.iter().map(|e| &e.message).collect::<Vec<_>>());
        assert_eq!(errs[0].message, format!("alias expansion exceeds {MAX_ALIAS_EXPANSION_BYTES} bytes"));
        // The anchor's copy and 15 aliases make 16 MiB, exactly the limit; the 16th alias does not fit.
        let line2 = text.lines().nth(1).expect("line 2");
        let last = line2.match_indices("*s").nth(15).expect("16th alias").0;
        assert_eq!(errs[0].pos, Pos { line: 2, col: last as u32 + 1 });
        assert!(docs.is_empty());
    }

    #[test]
    fn the_budget_is_per_file_and_later_documents_still_load() {
        // A bomb in the first document must not reset the budget for the next one, or a file
        // of many bombs would expand without bound; an alias-free document still loads.
        let text = format!("{}---\nplain: 1\n---\nx: &x [1, 2]\ny: *x\n", billion_laughs());
        let (docs, errs) = parse(&text);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(docs.len(), 2);
        assert_eq!((docs[0].index, &docs[0].value), (1, &serde_json::json!({"plain": 1})));
        // 91 240 nodes were copied before the rejected alias; 6 more still fit.
        assert_eq!(docs[1].value, serde_json::json!({"x": [1, 2], "y": [1, 2]}));
    }

    #[test]
    fn ordinary_aliases_expand_with_positions() {
        let text = "base: &base\n  cpu: 2\n  tags: [a, b]\nx: *base\ny:\n  - *base\n  - &n 3\n  - *n\n";
        let (docs, errs) = parse(text);
        assert!(errs.is_empty(), "{errs:?}");
        let d = &docs[0];
        assert_eq!(d.value["x"], serde_json::json!({"cpu": 2, "tags": ["a", "b"]}));
        assert_eq!(d.value["y"], serde_json::json!([{"cpu": 2, "tags": ["a", "b"]}, 3, 3]));
        assert_eq!(d.value_pos_of("x"), Pos { line: 4, col: 4 });
        assert_eq!(d.value_pos_of("y[2]"), Pos { line: 8, col: 5 });
    }

    #[test]
    fn expansion_just_under_the_limit_is_accepted() {
        // The anchor's copy (10 nodes) and 9 999 aliases of it: 100 000 nodes, the limit.
        let items = vec!["*a"; 9_999].join(", ");
        let text = format!("a: &a [0, 1, 2, 3, 4, 5, 6, 7, 8]\nb: [{items}]\n");
        let (docs, errs) = parse(&text);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(docs[0].value["b"].as_array().map(Vec::len), Some(9_999));
        let (_, errs) = parse(&format!("{text}c: [*a, *a]\n"));
        assert_eq!(errs.len(), 1, "one more alias crosses it: {errs:?}");
        assert_eq!(errs[0].pos.col, 5, "the first alias of line 3");
        assert_eq!(errs[0].pos.line, 3);
    }

    #[test]
    fn nested_anchors_are_charged_for_their_copies() {
        // Each of the 200 nested anchors keeps a copy of everything inside it: ~200 · 1 100
        // nodes if all were kept. Only the inner ones fit the budget; not keeping the outer
        // ones is harmless until an alias needs one.
        let inner = vec!["0"; 1000].join(", ");
        let open: String = (0..200).map(|i| format!("&a{i} [")).collect();
        let close = "]".repeat(200);
        let text = format!("x: {open}{inner}{close}\n");
        let (docs, errs) = parse(&text);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(docs[0].value.pointer(&format!("/x{}/999", "/0".repeat(199))), Some(&serde_json::json!(0)));
        let (docs, errs) = parse(&format!("{text}z: *a0\n"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].pos, Pos { line: 2, col: 4 });
        assert_eq!(errs[0].message, "alias expansion exceeds 100000 nodes");
        assert!(docs.is_empty());
    }
}
