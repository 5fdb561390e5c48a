//! The host half of a [`GradientSet`](super::GradientSet) as every front-end
//! writes it: a gradient's data read out as bytes and kept, so its average is
//! written back into the same buffer (a step allocates nothing for the
//! gradients), and zeros for a parameter this rank has no gradient for. A
//! front-end only turns its tensors into its data type `D` (a Burn
//! version's `TensorData`) and back, and says how to see `D` as bytes.

use crate::error::{CommError, Result};

/// How a front-end sees its data as the elements' bytes, in place (`None`:
/// not laid out as elements of a type the collectives move).
pub type ElementBytes<D> = fn(&mut D) -> Option<&mut [u8]>;

/// The data read for each parameter of one synchronisation, until its
/// average is written back.
pub struct HostCopies<D> {
    rank: usize,
    bytes_of: ElementBytes<D>,
    read: Vec<Option<D>>,
}

impl<D> HostCopies<D> {
    /// Copies for the parameters of one synchronisation, on `rank` (for
    /// messages).
    pub fn new(rank: usize, bytes_of: ElementBytes<D>) -> Self {
        Self {
            rank,
            bytes_of,
            read: Vec::new(),
        }
    }

    /// Makes room for one more parameter.
    pub fn push(&mut self) {
        self.read.push(None);
    }

    /// `GradientSet::read_host`: `data`'s bytes into `out` (zeros for
    /// `None`), keeping `data` for [`write`](Self::write).
    pub fn read(&mut self, index: usize, data: Option<D>, out: &mut [u8]) -> Result<()> {
        let Some(mut data) = data else {
            out.fill(0);
            return Ok(());
        };
        let bytes = (self.bytes_of)(&mut data)
            .ok_or_else(|| self.error(index, "unreadable as its element type".into()))?;
        if bytes.len() != out.len() {
            let message = format!("{} bytes where {} were expected", bytes.len(), out.len());
            return Err(self.error(index, message));
        }
        out.copy_from_slice(bytes);
        self.read[index] = Some(data);
        Ok(())
    }

    /// `GradientSet::keep_for_average`: `data`, read elsewhere, kept as the
    /// buffer parameter `index`'s average is written into (no copy).
    pub fn keep(&mut self, index: usize, data: Option<D>) {
        self.read[index] = data;
    }

    /// `GradientSet::write_host`: the data read for parameter `index` (or
    /// `zeros()` when it had none) with `averaged` written into it.
    pub fn write(&mut self, index: usize, averaged: &[u8], zeros: impl FnOnce() -> D) -> Result<D> {
        let mut data = self.read[index].take().unwrap_or_else(zeros);
        let bytes = (self.bytes_of)(&mut data)
            .ok_or_else(|| self.error(index, "cannot write the average back".into()))?;
        if bytes.len() != averaged.len() {
            let message = format!("{} bytes for an average of {}", bytes.len(), averaged.len());
            return Err(self.error(index, message));
        }
        bytes.copy_from_slice(averaged);
        Ok(data)
    }

    fn error(&self, index: usize, what: String) -> CommError {
        CommError::InvalidArgument {
            rank: self.rank,
            message: format!("gradient of parameter #{index}: {what}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(data: &mut Vec<u8>) -> Option<&mut [u8]> {
        Some(data.as_mut_slice())
    }

    #[test]
    fn reads_keep_the_buffer_for_the_average_and_missing_ones_are_zero() {
        let mut copies = HostCopies::new(2, bytes);
        copies.push();
        copies.push();
        let mut out = [9u8; 3];
        copies.read(0, Some(vec![1, 2, 3]), &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        copies.read(1, None, &mut out).unwrap();
        assert_eq!(out, [0, 0, 0]);
        let back = copies.write(0, &[4, 5, 6], || unreachable!()).unwrap();
        assert_eq!(back, [4, 5, 6]);
        let fresh = copies.write(1, &[7, 8, 9], || vec![0; 3]).unwrap();
        assert_eq!(fresh, [7, 8, 9]);
        let err = copies
            .read(0, Some(vec![1]), &mut out)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 2") && err.contains("parameter #0"),
            "{err}"
        );
        let err = copies
            .write(1, &[1], || vec![0; 3])
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 bytes for an average of 1"), "{err}");
    }
}
