//! The rendezvous wire format: length-prefixed frames over TCP, one message each, integers and
//! floats little-endian. Tensors travel as `(rows, cols, f32 data)`.

use std::io::{self, Read, Write};

/// Frames larger than this are refused (a corrupt or hostile length prefix).
const MAX_FRAME: usize = 1 << 31;

/// A tensor on the wire.
#[derive(Clone, Debug, PartialEq)]
pub struct WireTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// Identifies one process group: its kind's code and its members' global ranks.
pub type GroupKey = (u8, Vec<u64>);

#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// First message of every rank to rank 0.
    Hello {
        rank: u64,
        token: String,
    },
    /// Rank 0 accepts: the bytes every rank needs (the NCCL unique id on CUDA; empty on CPU).
    Welcome {
        payload: Vec<u8>,
    },
    /// Rank 0 refuses the connection or gives up the rendezvous.
    Reject {
        reason: String,
    },
    /// A member's deposit into one round of a group exchange.
    Exchange {
        key: GroupKey,
        index: u64,
        parts: Vec<WireTensor>,
    },
    /// Every member's deposit of the round, in member order.
    ExchangeDone {
        key: GroupKey,
        deposits: Vec<Vec<WireTensor>>,
    },
    /// Point-to-point message for rank 0 to forward.
    Send {
        to: u64,
        tag: u64,
        tensor: WireTensor,
    },
    /// A forwarded point-to-point message.
    Deliver {
        from: u64,
        tag: u64,
        tensor: WireTensor,
    },
    Heartbeat,
    /// This rank failed and says why.
    Fail {
        reason: String,
    },
    /// Every rank must stop: `rank` failed for `reason`.
    Abort {
        rank: u64,
        reason: String,
    },
    /// This rank finished cleanly.
    Done,
}

struct Encoder(Vec<u8>);

impl Encoder {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn tensor(&mut self, t: &WireTensor) {
        self.u64(t.rows as u64);
        self.u64(t.cols as u64);
        self.u64(t.data.len() as u64);
        for v in &t.data {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }
    fn tensors(&mut self, ts: &[WireTensor]) {
        self.u64(ts.len() as u64);
        ts.iter().for_each(|t| self.tensor(t));
    }
    fn key(&mut self, (kind, members): &GroupKey) {
        self.u8(*kind);
        self.u64(members.len() as u64);
        members.iter().for_each(|&m| self.u64(m));
    }
}

struct Decoder<'a>(&'a [u8]);

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed frame: {what}"),
    )
}

impl Decoder<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(malformed("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> io::Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("eight bytes")))
    }
    fn len(&mut self, unit: usize) -> io::Result<usize> {
        let n = self.u64()? as usize;
        if n.saturating_mul(unit) > self.0.len() {
            return Err(malformed("length beyond the frame"));
        }
        Ok(n)
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.len(1)?;
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| malformed("text is not UTF-8"))
    }
    fn tensor(&mut self) -> io::Result<WireTensor> {
        let rows = self.u64()? as usize;
        let cols = self.u64()? as usize;
        let n = self.len(4)?;
        if rows.checked_mul(cols) != Some(n) {
            return Err(malformed("tensor size does not match its shape"));
        }
        let data = self
            .take(4 * n)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("four bytes")))
            .collect();
        Ok(WireTensor { rows, cols, data })
    }
    fn tensors(&mut self) -> io::Result<Vec<WireTensor>> {
        let n = self.len(24)?;
        (0..n).map(|_| self.tensor()).collect()
    }
    fn key(&mut self) -> io::Result<GroupKey> {
        let kind = self.u8()?;
        let n = self.len(8)?;
        let members = (0..n).map(|_| self.u64()).collect::<io::Result<_>>()?;
        Ok((kind, members))
    }
}

impl Message {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder(Vec::new());
        match self {
            Message::Hello { rank, token } => {
                e.u8(0);
                e.u64(*rank);
                e.bytes(token.as_bytes());
            }
            Message::Welcome { payload } => {
                e.u8(1);
                e.bytes(payload);
            }
            Message::Reject { reason } => {
                e.u8(2);
                e.bytes(reason.as_bytes());
            }
            Message::Exchange { key, index, parts } => {
                e.u8(3);
                e.key(key);
                e.u64(*index);
                e.tensors(parts);
            }
            Message::ExchangeDone { key, deposits } => {
                e.u8(4);
                e.key(key);
                e.u64(deposits.len() as u64);
                deposits.iter().for_each(|d| e.tensors(d));
            }
            Message::Send { to, tag, tensor } => {
                e.u8(5);
                e.u64(*to);
                e.u64(*tag);
                e.tensor(tensor);
            }
            Message::Deliver { from, tag, tensor } => {
                e.u8(6);
                e.u64(*from);
                e.u64(*tag);
                e.tensor(tensor);
            }
            Message::Heartbeat => e.u8(7),
            Message::Fail { reason } => {
                e.u8(8);
                e.bytes(reason.as_bytes());
            }
            Message::Abort { rank, reason } => {
                e.u8(9);
                e.u64(*rank);
                e.bytes(reason.as_bytes());
            }
            Message::Done => e.u8(10),
        }
        e.0
    }

    pub fn decode(frame: &[u8]) -> io::Result<Message> {
        let mut d = Decoder(frame);
        let m = match d.u8()? {
            0 => Message::Hello {
                rank: d.u64()?,
                token: d.string()?,
            },
            1 => Message::Welcome {
                payload: d.bytes()?,
            },
            2 => Message::Reject {
                reason: d.string()?,
            },
            3 => Message::Exchange {
                key: d.key()?,
                index: d.u64()?,
                parts: d.tensors()?,
            },
            4 => {
                let key = d.key()?;
                let n = d.len(8)?;
                let deposits = (0..n).map(|_| d.tensors()).collect::<io::Result<_>>()?;
                Message::ExchangeDone { key, deposits }
            }
            5 => Message::Send {
                to: d.u64()?,
                tag: d.u64()?,
                tensor: d.tensor()?,
            },
            6 => Message::Deliver {
                from: d.u64()?,
                tag: d.u64()?,
                tensor: d.tensor()?,
            },
            7 => Message::Heartbeat,
            8 => Message::Fail {
                reason: d.string()?,
            },
            9 => Message::Abort {
                rank: d.u64()?,
                reason: d.string()?,
            },
            10 => Message::Done,
            other => return Err(malformed(&format!("unknown message kind {other}"))),
        };
        if !d.0.is_empty() {
            return Err(malformed("trailing bytes"));
        }
        Ok(m)
    }
}

pub fn write_message(w: &mut impl Write, m: &Message) -> io::Result<()> {
    let body = m.encode();
    let mut frame = Vec::with_capacity(body.len() + 8);
    frame.extend_from_slice(&(body.len() as u64).to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)?;
    w.flush()
}

pub fn read_message(r: &mut impl Read) -> io::Result<Message> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let n = u64::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(malformed("frame too large"));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    Message::decode(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let t = WireTensor {
            rows: 2,
            cols: 1,
            data: vec![1.5, -0.25],
        };
        let key: GroupKey = (3, vec![0, 2]);
        let messages = vec![
            Message::Hello {
                rank: 3,
                token: "secret".into(),
            },
            Message::Welcome {
                payload: vec![1, 2, 3],
            },
            Message::Reject {
                reason: "no".into(),
            },
            Message::Exchange {
                key: key.clone(),
                index: 1,
                parts: vec![t.clone()],
            },
            Message::ExchangeDone {
                key,
                deposits: vec![vec![t.clone()], vec![]],
            },
            Message::Send {
                to: 1,
                tag: 9,
                tensor: t.clone(),
            },
            Message::Deliver {
                from: 0,
                tag: 9,
                tensor: t,
            },
            Message::Heartbeat,
            Message::Fail {
                reason: "oom".into(),
            },
            Message::Abort {
                rank: 2,
                reason: "oom".into(),
            },
            Message::Done,
        ];
        for m in messages {
            let mut buf = Vec::new();
            write_message(&mut buf, &m).unwrap();
            assert_eq!(read_message(&mut buf.as_slice()).unwrap(), m);
        }
    }

    #[test]
    fn corrupt_frames_are_errors() {
        assert!(Message::decode(&[42]).is_err());
        assert!(Message::decode(&[]).is_err());
        // A tensor claiming more data than the frame holds.
        let mut e = Encoder(Vec::new());
        e.u8(5);
        e.u64(0);
        e.u64(0);
        e.u64(1000);
        e.u64(1000);
        e.u64(1_000_000);
        assert!(Message::decode(&e.0).is_err());
        let mut huge = Vec::new();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_message(&mut huge.as_slice()).is_err());
    }
}
