//! The few MessagePack encodings the wire format needs, written out by hand so the bytes are exactly
//! msgspec's (the smallest representation of each integer, floats as float64, `str8` never used for
//! short strings), which the golden-byte tests pin.

/// Appends MessagePack values to a byte buffer.
#[derive(Debug, Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn nil(&mut self) {
        self.buf.push(0xc0);
    }

    pub fn uint(&mut self, v: u64) {
        let b = &mut self.buf;
        if v < 0x80 {
            b.push(v as u8);
        } else if v <= 0xff {
            b.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            b.push(0xcd);
            b.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            b.push(0xce);
            b.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            b.push(0xcf);
            b.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn int(&mut self, v: i64) {
        if v >= 0 {
            return self.uint(v as u64);
        }
        let b = &mut self.buf;
        if v >= -32 {
            b.push(v as i8 as u8);
        } else if v >= i8::MIN as i64 {
            b.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i16::MIN as i64 {
            b.push(0xd1);
            b.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i32::MIN as i64 {
            b.push(0xd2);
            b.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            b.push(0xd3);
            b.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn str(&mut self, s: &str) {
        let n = s.len();
        let b = &mut self.buf;
        if n < 32 {
            b.push(0xa0 | n as u8);
        } else if n <= 0xff {
            b.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= 0xffff {
            b.push(0xda);
            b.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            b.push(0xdb);
            b.extend_from_slice(&(n as u32).to_be_bytes());
        }
        b.extend_from_slice(s.as_bytes());
    }

    pub fn array(&mut self, n: usize) {
        self.header(n, 0x90, 0xdc, 0xdd);
    }

    pub fn map(&mut self, n: usize) {
        self.header(n, 0x80, 0xde, 0xdf);
    }

    fn header(&mut self, n: usize, fix: u8, h16: u8, h32: u8) {
        let b = &mut self.buf;
        if n < 16 {
            b.push(fix | n as u8);
        } else if n <= 0xffff {
            b.push(h16);
            b.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            b.push(h32);
            b.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    pub fn uints<T: Copy + Into<u64>>(&mut self, vs: &[T]) {
        self.array(vs.len());
        for &v in vs {
            self.uint(v.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Writer;

    fn enc(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::default();
        f(&mut w);
        w.buf
    }

    #[test]
    fn integers_take_the_smallest_msgpack_form() {
        assert_eq!(enc(|w| w.uint(0x7f)), [0x7f]);
        assert_eq!(enc(|w| w.uint(0x80)), [0xcc, 0x80]);
        assert_eq!(enc(|w| w.uint(0x100)), [0xcd, 1, 0]);
        assert_eq!(enc(|w| w.uint(0x1_0000)), [0xce, 0, 1, 0, 0]);
        assert_eq!(
            enc(|w| w.uint(u64::MAX)),
            [0xcf, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        assert_eq!(enc(|w| w.int(-1)), [0xff]);
        assert_eq!(enc(|w| w.int(-33)), [0xd0, 0xdf]);
        assert_eq!(enc(|w| w.int(-129)), [0xd1, 0xff, 0x7f]);
    }

    #[test]
    fn containers_and_strings_use_fix_forms_when_short() {
        assert_eq!(enc(|w| w.str("GPU")), [0xa3, b'G', b'P', b'U']);
        assert_eq!(enc(|w| w.array(3)), [0x93]);
        assert_eq!(enc(|w| w.array(16)), [0xdc, 0, 16]);
        assert_eq!(enc(|w| w.map(2)), [0x82]);
        assert_eq!(enc(|w| w.str(&"x".repeat(40)))[..2], [0xd9, 40]);
    }
}
