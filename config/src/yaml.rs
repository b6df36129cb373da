//! YAML → JSON values with source positions.
//!
//! Each document becomes a `serde_json::Value` plus a map from field paths (`spec.steps[1].type`)
//! to the position of the key and of the value, so later stages can point at the exact line
//! of any field. Plain scalars follow the YAML 1.2 core schema (what `kubectl` accepts for
//! these types). Duplicate keys are errors, as in the API server's strict decoding. A syntax
//! error ends the file, but documents before it are kept.

use std::collections::BTreeMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::diagnostics::Pos;

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

fn to_pos(m: &Marker) -> Pos {
    // yaml-rust2 markers: line from 1, column from 0.
    Pos { line: m.line().max(1) as u32, col: m.col() as u32 + 1 }
}

enum Frame {
    Map { map: Map<String, Value>, path: String, anchor: usize, pending_key: Option<String> },
    Seq { items: Vec<Value>, path: String, anchor: usize },
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
    anchors: BTreeMap<usize, Value>,
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

    fn attach(&mut self, value: Value) {
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some(Frame::Map { map, pending_key, .. }) => {
                if let Some(k) = pending_key.take() {
                    map.insert(k, value);
                }
            }
            Some(Frame::Seq { items, .. }) => items.push(value),
        }
    }

    fn finish_document(&mut self) {
        self.stack.clear();
        self.unplaced.clear();
        if let Some(value) = self.root.take() {
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
        self.doc_start = None;
        self.doc_index += 1;
    }

    fn on_scalar(&mut self, text: String, style: TScalarStyle, anchor: usize, tag: Option<Tag>, pos: Pos) {
        self.place(pos);
        let as_key = matches!(self.stack.last(), Some(Frame::Map { pending_key: None, .. }));
        if as_key {
            let path = match self.stack.last() {
                Some(Frame::Map { path, map, .. }) => {
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
        let value = resolve_scalar(text, style, tag.as_ref());
        if let Some(path) = self.next_child_path() {
            self.value_pos.insert(path, pos);
        }
        if anchor > 0 {
            self.anchors.insert(anchor, value.clone());
        }
        self.attach(value);
    }

    fn open(&mut self, is_map: bool, anchor: usize, pos: Pos) {
        let Some(path) = self.next_child_path() else {
            self.errors
                .push(YamlError { pos, message: "complex (non-scalar) mapping keys are not supported".to_owned() });
            // Still track the structure so the parser's later events stay balanced.
            let path = "<complex-key>".to_owned();
            self.stack.push(if is_map {
                Frame::Map { map: Map::new(), path, anchor: 0, pending_key: None }
            } else {
                Frame::Seq { items: Vec::new(), path, anchor: 0 }
            });
            return;
        };
        self.unplaced.push(Unplaced { path: path.clone(), fallback: pos });
        self.stack.push(if is_map {
            Frame::Map { map: Map::new(), path, anchor, pending_key: None }
        } else {
            Frame::Seq { items: Vec::new(), path, anchor }
        });
    }

    fn close(&mut self) {
        let Some(frame) = self.stack.pop() else { return };
        let (value, anchor, path) = match frame {
            Frame::Map { map, anchor, path, .. } => (Value::Object(map), anchor, path),
            Frame::Seq { items, anchor, path } => (Value::Array(items), anchor, path),
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
            self.anchors.insert(anchor, value.clone());
        }
        self.attach(value);
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
                let value = match self.anchors.get(&id) {
                    Some(v) => v.clone(),
                    None => {
                        self.errors.push(YamlError { pos, message: "alias to an unknown anchor".to_owned() });
                        Value::Null
                    }
                };
                if matches!(self.stack.last(), Some(Frame::Map { pending_key: None, .. })) {
                    self.errors.push(YamlError { pos, message: "aliases cannot be used as mapping keys".to_owned() });
                    return;
                }
                if let Some(path) = self.next_child_path() {
                    self.value_pos.insert(path, pos);
                }
                self.attach(value);
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
}
