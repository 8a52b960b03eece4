//! An allow-listed pickle reader for the `data.pkl` of `torch.save` archives.
//!
//! Unpickling normally runs code: `GLOBAL` imports any callable and `REDUCE` calls it
//! (docs/parsers-threat-model.md). This VM interprets only the opcodes that tensor files
//! use and resolves only the globals that rebuild tensors, storages, dtypes and ordered
//! dicts; it calls nothing. Everything else stops the read with an error naming the opcode
//! or the global and its byte offset. What `torch.save` (torch 2.15) writes, seen with
//! `pickletools.dis`: protocol 2 with `GLOBAL 'torch._utils _rebuild_tensor_v2'`, typed
//! storage classes (`torch FloatStorage`) in a `BINPERSID` tuple
//! `('storage', <class>, '<key>', '<location>', numel)`, `collections OrderedDict` for
//! backward hooks and state dicts; dtypes without a legacy storage class (fp8, uint16) use
//! `_rebuild_tensor_v3` with `torch.storage UntypedStorage` and a `torch <dtype>` global;
//! `pickle_protocol=4` adds `FRAME`, `SHORT_BINUNICODE`, `MEMOIZE` and `STACK_GLOBAL`.
//! Opcode semantics: CPython `Lib/pickletools.py` (the opcode table) and `Lib/pickle.py`.
//!
//! Containers live in an arena and the stack holds indices, so `BINGET` of a large list
//! costs nothing and a self-referencing list cannot leak or recurse forever.

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use crate::elem::{ElemType, MAX_RANK};
use crate::FormatError;

/// Longest `data.pkl` accepted: 64 MiB (a state dict of 10^4 tensors pickles to ~2 MiB).
pub const MAX_PICKLE_BYTES: u64 = 64 << 20;
/// Deepest stack of values.
const MAX_STACK: usize = 1 << 20;
/// Most memo entries.
const MAX_MEMO: usize = 1 << 20;
/// Most container objects built.
const MAX_OBJECTS: usize = 1 << 22;
/// Deepest nesting of `MARK`s (tuple/list/dict literals inside each other).
const MAX_MARKS: usize = 4096;
/// Deepest container nesting walked when collecting tensors.
pub const MAX_DEPTH: usize = 64;

/// A value on the VM's stack or in its memo.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    /// An index into the object arena.
    Obj(usize),
}

/// A heap object.
#[derive(Debug, Clone, PartialEq)]
pub enum Obj {
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Global(Global),
    Storage(StorageRef),
    Tensor(TensorRef),
}

/// The globals a tensor file may name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Global {
    RebuildTensorV2,
    RebuildTensorV3,
    RebuildParameter,
    OrderedDict,
    /// A typed storage class (`torch.FloatStorage`...), or `None` for `UntypedStorage`.
    StorageClass(Option<ElemType>),
    Dtype(ElemType),
}

/// A storage named by a persistent id: the archive member `data/<key>`.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    pub key: String,
    /// Element type of a typed storage; `None` for an untyped (byte) storage.
    pub dtype: Option<ElemType>,
    /// Elements (typed) or bytes (untyped), as the writer declared.
    pub numel: u64,
}

/// A tensor rebuilt by `_rebuild_tensor_v2/v3`: a strided view of a storage.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    pub storage: StorageRef,
    pub dtype: ElemType,
    /// In elements.
    pub offset: usize,
    pub shape: Vec<usize>,
    /// In elements.
    pub strides: Vec<usize>,
}

/// The result of running a pickle: the root value and the arena it points into.
#[derive(Debug)]
pub struct Unpickled {
    pub root: Value,
    pub objects: Vec<Obj>,
}

/// Resolves `module.name` against the allow-list.
fn resolve_global(module: &str, name: &str) -> Option<Global> {
    let storage = |t| Some(Global::StorageClass(Some(t)));
    match (module, name) {
        ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensorV2),
        ("torch._utils", "_rebuild_tensor_v3") => Some(Global::RebuildTensorV3),
        ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
        ("collections", "OrderedDict") => Some(Global::OrderedDict),
        ("torch.storage", "UntypedStorage") => Some(Global::StorageClass(None)),
        ("torch", "FloatStorage") => storage(ElemType::F32),
        ("torch", "DoubleStorage") => storage(ElemType::F64),
        ("torch", "HalfStorage") => storage(ElemType::F16),
        ("torch", "BFloat16Storage") => storage(ElemType::BF16),
        ("torch", "LongStorage") => storage(ElemType::I64),
        ("torch", "IntStorage") => storage(ElemType::I32),
        ("torch", "ShortStorage") => storage(ElemType::I16),
        ("torch", "CharStorage") => storage(ElemType::I8),
        ("torch", "ByteStorage") => storage(ElemType::U8),
        ("torch", "BoolStorage") => storage(ElemType::Bool),
        ("torch", dtype) => {
            let t = match dtype {
                "float32" | "float" => ElemType::F32,
                "float64" | "double" => ElemType::F64,
                "float16" | "half" => ElemType::F16,
                "bfloat16" => ElemType::BF16,
                "int8" => ElemType::I8,
                "int16" | "short" => ElemType::I16,
                "int32" | "int" => ElemType::I32,
                "int64" | "long" => ElemType::I64,
                "uint8" => ElemType::U8,
                "uint16" => ElemType::U16,
                "uint32" => ElemType::U32,
                "uint64" => ElemType::U64,
                "bool" => ElemType::Bool,
                "float8_e4m3fn" => ElemType::F8E4M3Fn,
                "float8_e5m2" => ElemType::F8E5M2,
                _ => return None,
            };
            Some(Global::Dtype(t))
        }
        _ => None,
    }
}

/// CPython's name for an opcode byte (`pickletools.opcodes`), for error messages.
fn opcode_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown opcode",
    }
}

struct Vm<'a> {
    path: &'a Path,
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run (for errors).
    at: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    objects: Vec<Obj>,
}

/// Runs the pickle in `data` (the contents of `data.pkl`); `path` names it in errors.
pub fn unpickle(path: &Path, data: &[u8]) -> Result<Unpickled, FormatError> {
    if data.len() as u64 > MAX_PICKLE_BYTES {
        return Err(FormatError::TooLarge {
            path: path.to_path_buf(),
            field: "pickle (data.pkl) size".into(),
            value: data.len() as u64,
            limit: MAX_PICKLE_BYTES,
        });
    }
    let mut vm = Vm {
        path,
        data,
        pos: 0,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        objects: Vec::new(),
    };
    let root = vm.run()?;
    Ok(Unpickled { root, objects: vm.objects })
}

impl<'a> Vm<'a> {
    fn err(&self, reason: impl Into<String>) -> FormatError {
        FormatError::invalid(self.path, format!("pickle at byte {}", self.at), reason)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(FormatError::Truncated {
                path: self.path.to_path_buf(),
                field: format!("pickle opcode argument at byte {}", self.at),
                offset: self.pos as u64,
                file_len: self.data.len() as u64,
            });
        };
        let data: &'a [u8] = self.data;
        let s = data.get(self.pos..end).unwrap_or_default();
        self.pos = end;
        Ok(s)
    }

    fn arg<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn push(&mut self, v: Value) -> Result<(), FormatError> {
        if self.stack.len() >= MAX_STACK {
            return Err(self.err(format!("stack deeper than {MAX_STACK}")));
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Result<Value, FormatError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    fn alloc(&mut self, o: Obj) -> Result<Value, FormatError> {
        if self.objects.len() >= MAX_OBJECTS {
            return Err(self.err(format!("more than {MAX_OBJECTS} objects")));
        }
        self.objects.push(o);
        Ok(Value::Obj(self.objects.len() - 1))
    }

    /// Pops everything above the topmost mark, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>, FormatError> {
        let m = self.marks.pop().ok_or_else(|| self.err("no MARK on the stack"))?;
        Ok(self.stack.split_off(m.min(self.stack.len())))
    }

    fn string(&mut self, n: u64) -> Result<Value, FormatError> {
        let n = usize::try_from(n).map_err(|_| self.err("string length overflows"))?;
        let bytes = self.take(n)?;
        let s =
            std::str::from_utf8(bytes).map_err(|_| FormatError::invalid(self.path, "pickle string", "not UTF-8"))?;
        Ok(Value::Str(Rc::from(s)))
    }

    fn memo_put(&mut self, key: u32) -> Result<(), FormatError> {
        let top = self.stack.last().cloned().ok_or_else(|| self.err("memo put on an empty stack"))?;
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&key) {
            return Err(self.err(format!("more than {MAX_MEMO} memo entries")));
        }
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), FormatError> {
        let v = self.memo.get(&key).cloned().ok_or_else(|| self.err(format!("memo key {key} was never stored")))?;
        self.push(v)
    }

    fn global(&mut self, module: &str, name: &str) -> Result<(), FormatError> {
        match resolve_global(module, name) {
            Some(g) => {
                let v = self.alloc(Obj::Global(g))?;
                self.push(v)
            }
            None => Err(self.err(format!(
                "global '{module}.{name}' is not on the allow-list of tensor-file globals (refused, never executed)"
            ))),
        }
    }

    fn obj(&self, v: &Value) -> Option<&Obj> {
        match v {
            Value::Obj(i) => self.objects.get(*i),
            _ => None,
        }
    }

    fn run(&mut self) -> Result<Value, FormatError> {
        loop {
            self.at = self.pos;
            let op = *self.take(1)?.first().unwrap_or(&0);
            match op {
                0x80 => {
                    let [p] = self.arg::<1>()?;
                    if !(2..=5).contains(&p) {
                        return Err(self.err(format!("pickle protocol {p} (2 to 5 are read)")));
                    }
                }
                0x95 => {
                    self.arg::<8>()?; // FRAME: a length hint only.
                }
                b'.' => {
                    let v = self.pop()?;
                    if !self.marks.is_empty() {
                        return Err(self.err("STOP inside an open MARK"));
                    }
                    return Ok(v);
                }
                b'}' => {
                    let v = self.alloc(Obj::Dict(Vec::new()))?;
                    self.push(v)?;
                }
                b']' => {
                    let v = self.alloc(Obj::List(Vec::new()))?;
                    self.push(v)?;
                }
                b')' => {
                    let v = self.alloc(Obj::Tuple(Vec::new()))?;
                    self.push(v)?;
                }
                b'(' => {
                    if self.marks.len() >= MAX_MARKS {
                        return Err(self.err(format!("MARKs nested deeper than {MAX_MARKS}")));
                    }
                    self.marks.push(self.stack.len());
                }
                b'X' => {
                    let n = u32::from_le_bytes(self.arg()?);
                    let v = self.string(u64::from(n))?;
                    self.push(v)?;
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.arg()?);
                    let v = self.string(n)?;
                    self.push(v)?;
                }
                0x8c => {
                    let [n] = self.arg::<1>()?;
                    let v = self.string(u64::from(n))?;
                    self.push(v)?;
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.arg()?);
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'K' => {
                    let [v] = self.arg::<1>()?;
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.arg()?);
                    self.push(Value::Int(i64::from(v)))?;
                }
                0x8a => {
                    // LONG1: n bytes of little-endian two's complement; we read up to 8.
                    let [n] = self.arg::<1>()?;
                    if n > 8 {
                        return Err(self.err(format!("LONG1 of {n} bytes (integers wider than 64 bits)")));
                    }
                    let bytes = self.take(usize::from(n))?;
                    let mut buf = if bytes.last().is_some_and(|b| b & 0x80 != 0) { [0xffu8; 8] } else { [0u8; 8] };
                    buf[..bytes.len()].copy_from_slice(bytes);
                    self.push(Value::Int(i64::from_le_bytes(buf)))?;
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.arg()?);
                    self.push(Value::Float(v))?;
                }
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'N' => self.push(Value::None)?,
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    let v = self.alloc(Obj::Tuple(items))?;
                    self.push(v)?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.alloc(Obj::Tuple(items))?;
                    self.push(v)?;
                }
                b's' | b'u' => {
                    let items = if op == b's' {
                        let v = self.pop()?;
                        let k = self.pop()?;
                        vec![k, v]
                    } else {
                        self.pop_mark()?
                    };
                    if items.len() % 2 != 0 {
                        return Err(self.err("SETITEMS with an odd number of items"));
                    }
                    let target = self.stack.last().cloned().ok_or_else(|| self.err("SETITEM on an empty stack"))?;
                    let at = self.at;
                    match target {
                        Value::Obj(i) => match self.objects.get_mut(i) {
                            Some(Obj::Dict(d)) => {
                                let mut it = items.into_iter();
                                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                                    // Python dicts keep the last value of a repeated key.
                                    match d.iter_mut().find(|(dk, _)| *dk == k) {
                                        Some(slot) => slot.1 = v,
                                        None => d.push((k, v)),
                                    }
                                }
                            }
                            _ => {
                                return Err(FormatError::invalid(
                                    self.path,
                                    format!("pickle at byte {at}"),
                                    "SETITEM on a non-dict",
                                ))
                            }
                        },
                        _ => return Err(self.err("SETITEM on a non-dict")),
                    }
                }
                b'a' | b'e' => {
                    let items = if op == b'a' { vec![self.pop()?] } else { self.pop_mark()? };
                    let target = self.stack.last().cloned().ok_or_else(|| self.err("APPEND on an empty stack"))?;
                    match target {
                        Value::Obj(i) if matches!(self.objects.get(i), Some(Obj::List(_))) => {
                            if let Some(Obj::List(l)) = self.objects.get_mut(i) {
                                l.extend(items);
                            }
                        }
                        _ => return Err(self.err("APPEND on a non-list")),
                    }
                }
                b'q' => {
                    let [k] = self.arg::<1>()?;
                    self.memo_put(u32::from(k))?;
                }
                b'r' => {
                    let k = u32::from_le_bytes(self.arg()?);
                    self.memo_put(k)?;
                }
                0x94 => {
                    let k = u32::try_from(self.memo.len()).map_err(|_| self.err("memo overflow"))?;
                    self.memo_put(k)?;
                }
                b'h' => {
                    let [k] = self.arg::<1>()?;
                    self.memo_get(u32::from(k))?;
                }
                b'j' => {
                    let k = u32::from_le_bytes(self.arg()?);
                    self.memo_get(k)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.global(&module, &name)?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => self.global(&m, &n)?,
                        _ => return Err(self.err("STACK_GLOBAL needs two strings")),
                    }
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(&callable, &args)?;
                    self.push(v)?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let s = self.persistent(&pid)?;
                    let v = self.alloc(Obj::Storage(s))?;
                    self.push(v)?;
                }
                other => {
                    return Err(self
                        .err(format!("opcode {} (0x{other:02x}) is not allowed in a tensor file", opcode_name(other))))
                }
            }
        }
    }

    /// A newline-terminated ASCII argument of `GLOBAL` (at most 256 bytes).
    fn line(&mut self) -> Result<String, FormatError> {
        let rest = self.data.get(self.pos..).unwrap_or_default();
        let n = rest
            .iter()
            .take(256)
            .position(|&c| c == b'\n')
            .ok_or_else(|| self.err("GLOBAL name without a newline within 256 bytes"))?;
        let s = self.take(n)?.to_vec();
        self.take(1)?;
        String::from_utf8(s).map_err(|_| self.err("GLOBAL name is not UTF-8"))
    }

    fn tuple_items(&self, v: &Value, what: &str) -> Result<Vec<Value>, FormatError> {
        match self.obj(v) {
            Some(Obj::Tuple(t)) => Ok(t.clone()),
            _ => Err(self.err(format!("{what} is not a tuple"))),
        }
    }

    fn usize_list(&self, v: &Value, what: &str) -> Result<Vec<usize>, FormatError> {
        let items = self.tuple_items(v, what)?;
        if items.len() > MAX_RANK {
            return Err(self.err(format!("{what} has {} entries (rank over {MAX_RANK})", items.len())));
        }
        items
            .iter()
            .map(|x| match x {
                Value::Int(i) => usize::try_from(*i).map_err(|_| self.err(format!("{what} holds {i}"))),
                _ => Err(self.err(format!("{what} holds a non-integer"))),
            })
            .collect()
    }

    /// `REDUCE`: only allow-listed callables, each interpreted (never called).
    fn reduce(&mut self, callable: &Value, args: &Value) -> Result<Value, FormatError> {
        let g = match self.obj(callable) {
            Some(Obj::Global(g)) => *g,
            _ => return Err(self.err("REDUCE of something that is not an allow-listed global")),
        };
        let a = self.tuple_items(args, "REDUCE arguments")?;
        match g {
            Global::OrderedDict if a.is_empty() => self.alloc(Obj::Dict(Vec::new())),
            Global::RebuildParameter => match a.first() {
                Some(t @ Value::Obj(_)) if matches!(self.obj(t), Some(Obj::Tensor(_))) => Ok(t.clone()),
                _ => Err(self.err("_rebuild_parameter of a non-tensor")),
            },
            Global::RebuildTensorV2 | Global::RebuildTensorV3 => {
                let v3 = g == Global::RebuildTensorV3;
                if a.len() < if v3 { 7 } else { 6 } {
                    return Err(self.err(format!("_rebuild_tensor with {} arguments", a.len())));
                }
                let storage = match a.first().and_then(|s| self.obj(s)) {
                    Some(Obj::Storage(s)) => s.clone(),
                    _ => return Err(self.err("_rebuild_tensor of a non-storage")),
                };
                let offset = match a.get(1) {
                    Some(Value::Int(o)) => usize::try_from(*o).map_err(|_| self.err("negative storage offset"))?,
                    _ => return Err(self.err("storage offset is not an integer")),
                };
                let shape = self.usize_list(a.get(2).unwrap_or(&Value::None), "tensor size")?;
                let strides = self.usize_list(a.get(3).unwrap_or(&Value::None), "tensor stride")?;
                if shape.len() != strides.len() {
                    return Err(self.err("tensor size and stride differ in length"));
                }
                let dtype = if v3 {
                    match a.get(6).and_then(|d| self.obj(d)) {
                        Some(Obj::Global(Global::Dtype(t))) => *t,
                        _ => return Err(self.err("_rebuild_tensor_v3 without a dtype")),
                    }
                } else {
                    storage.dtype.ok_or_else(|| self.err("_rebuild_tensor_v2 of an untyped storage"))?
                };
                if let Some(st) = storage.dtype {
                    if st != dtype {
                        return Err(self.err("tensor dtype differs from its storage's"));
                    }
                }
                self.alloc(Obj::Tensor(TensorRef { storage, dtype, offset, shape, strides }))
            }
            other => Err(self.err(format!("REDUCE of {other:?} is not allowed"))),
        }
    }

    /// `BINPERSID`: `('storage', <storage class>, key, location, numel)`.
    fn persistent(&self, pid: &Value) -> Result<StorageRef, FormatError> {
        let t = self.tuple_items(pid, "persistent id")?;
        match t.as_slice() {
            [Value::Str(tag), class, Value::Str(key), Value::Str(_location), Value::Int(numel)]
                if &**tag == "storage" =>
            {
                let dtype = match self.obj(class) {
                    Some(Obj::Global(Global::StorageClass(t))) => *t,
                    _ => return Err(self.err("persistent id names no storage class")),
                };
                // Keys are decimal indices in every torch version; anything else could
                // name a path outside `data/`.
                if key.is_empty() || key.len() > 32 || !key.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                    return Err(self.err(format!("storage key '{key}' is not a plain name")));
                }
                let numel = u64::try_from(*numel).map_err(|_| self.err("negative storage size"))?;
                Ok(StorageRef { key: key.to_string(), dtype, numel })
            }
            _ => Err(self.err("persistent id is not ('storage', class, key, location, numel)")),
        }
    }
}

impl Unpickled {
    /// The tensors reachable from the root, named by their path: `""` for a root tensor,
    /// dict keys and list/tuple indices joined by `.` otherwise (`"layers.0.weight"`).
    /// Non-tensor leaves (ints, strings, None) are skipped.
    pub fn tensors(&self, path: &Path) -> Result<Vec<(String, TensorRef)>, FormatError> {
        let mut out = Vec::new();
        let mut on_path = Vec::new();
        self.walk(path, &self.root, String::new(), 0, &mut on_path, &mut out)?;
        Ok(out)
    }

    fn walk(
        &self,
        path: &Path,
        v: &Value,
        name: String,
        depth: usize,
        on_path: &mut Vec<usize>,
        out: &mut Vec<(String, TensorRef)>,
    ) -> Result<(), FormatError> {
        let Value::Obj(i) = v else { return Ok(()) };
        if depth > MAX_DEPTH {
            return Err(FormatError::invalid(path, "pickle", format!("containers nested deeper than {MAX_DEPTH}")));
        }
        if on_path.contains(i) {
            return Err(FormatError::invalid(path, "pickle", format!("container '{name}' contains itself")));
        }
        let join = |k: &str| if name.is_empty() { k.to_string() } else { format!("{name}.{k}") };
        on_path.push(*i);
        match self.objects.get(*i) {
            Some(Obj::Tensor(t)) => out.push((name.clone(), t.clone())),
            Some(Obj::List(items) | Obj::Tuple(items)) => {
                for (k, item) in items.iter().enumerate() {
                    self.walk(path, item, join(&k.to_string()), depth + 1, on_path, out)?;
                }
            }
            Some(Obj::Dict(entries)) => {
                for (k, item) in entries {
                    let key = match k {
                        Value::Str(s) => s.to_string(),
                        Value::Int(n) => n.to_string(),
                        _ => {
                            return Err(FormatError::invalid(
                                path,
                                "pickle",
                                format!("dict under '{name}' has a non-string key"),
                            ))
                        }
                    };
                    self.walk(path, item, join(&key), depth + 1, on_path, out)?;
                }
            }
            _ => {}
        }
        on_path.pop();
        Ok(())
    }
}
