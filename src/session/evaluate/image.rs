//! What an image a cell returned (a figure, a display's PNG, JPEG or GIF) must look like to
//! be returned as one: its format's signature and a header that gives its width and height,
//! read within the bytes (user code wrote them, so nothing here trusts a length it reads).

/// Width and height of an image of MIME type `mime`, or None if its bytes do not start as
/// that format does.
pub(super) fn size(mime: &str, data: &[u8]) -> Option<(u32, u32)> {
    match mime {
        "image/png" => png(data),
        "image/jpeg" => jpeg(data),
        "image/gif" => gif(data),
        _ => None,
    }
}

/// A PNG: the signature, then the IHDR chunk first (13 bytes of data) with a width and a
/// height that are not zero.
fn png(data: &[u8]) -> Option<(u32, u32)> {
    const SIG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if data.len() < 24 || &data[..8] != SIG || data[8..12] != [0, 0, 0, 13] {
        return None;
    }
    if &data[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(data[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(data[20..24].try_into().ok()?);
    (w > 0 && h > 0).then_some((w, h))
}

/// A GIF: `GIF87a` or `GIF89a`, then the logical screen's width and height (little-endian),
/// not zero.
fn gif(data: &[u8]) -> Option<(u32, u32)> {
    if data.len() < 13 || !(data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a")) {
        return None;
    }
    let w = u16::from_le_bytes([data[6], data[7]]);
    let h = u16::from_le_bytes([data[8], data[9]]);
    (w > 0 && h > 0).then_some((u32::from(w), u32::from(h)))
}

/// A JPEG: the start-of-image marker, then marker segments up to a start-of-frame one,
/// which gives the height and width (a width of zero is no image).
fn jpeg(data: &[u8]) -> Option<(u32, u32)> {
    if !data.starts_with(b"\xff\xd8") {
        return None;
    }
    let mut i = 2;
    loop {
        // A marker: 0xff (fill bytes may repeat it), then its code.
        if *data.get(i)? != 0xff {
            return None;
        }
        while *data.get(i)? == 0xff {
            i += 1;
        }
        let code = data[i];
        i += 1;
        match code {
            // Markers without a segment.
            0x01 | 0xd0..=0xd7 => continue,
            // End of image, or entropy-coded data, before any frame header.
            0x00 | 0xd8 | 0xd9 | 0xda => return None,
            _ => {}
        }
        let len = usize::from(u16::from_be_bytes([*data.get(i)?, *data.get(i + 1)?]));
        if len < 2 {
            return None;
        }
        // SOF0-SOF15, but not DHT (c4), JPG (c8) or DAC (cc).
        if (0xc0..=0xcf).contains(&code) && ![0xc4, 0xc8, 0xcc].contains(&code) {
            let seg = data.get(i + 2..i + len)?;
            if seg.len() < 5 {
                return None;
            }
            let h = u16::from_be_bytes([seg[1], seg[2]]);
            let w = u16::from_be_bytes([seg[3], seg[4]]);
            return (w > 0).then_some((u32::from(w), u32::from(h)));
        }
        i += len;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The smallest header of each format that passes, for tests.
    pub(crate) fn png_header(w: u32, h: u32) -> Vec<u8> {
        let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        v.extend_from_slice(&w.to_be_bytes());
        v.extend_from_slice(&h.to_be_bytes());
        v.extend_from_slice(&[8, 6, 0, 0, 0]);
        v
    }

    fn jpeg_header(w: u16, h: u16) -> Vec<u8> {
        let mut v =
            b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00".to_vec();
        v.extend_from_slice(b"\xff\xc0\x00\x11\x08");
        v.extend_from_slice(&h.to_be_bytes());
        v.extend_from_slice(&w.to_be_bytes());
        v.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        v
    }

    #[test]
    fn each_format_needs_its_header_not_only_its_signature() {
        assert_eq!(size("image/png", &png_header(640, 480)), Some((640, 480)));
        assert_eq!(
            size("image/png", b"\x89PNG\r\n\x1a\nrest of it, no IHDR"),
            None
        );
        assert_eq!(size("image/png", &png_header(0, 480)), None);
        let mut wrong = png_header(4, 4);
        wrong[12..16].copy_from_slice(b"IDAT");
        assert_eq!(size("image/png", &wrong), None);

        assert_eq!(size("image/jpeg", &jpeg_header(32, 16)), Some((32, 16)));
        assert_eq!(size("image/jpeg", b"\xff\xd8\xff"), None);
        assert_eq!(size("image/jpeg", b"\xff\xd8\xff\xe0\xff\xff"), None);
        assert_eq!(size("image/jpeg", b"\xff\xd8\xff\xda\x00\x02"), None);
        assert_eq!(size("image/jpeg", &jpeg_header(0, 16)), None);

        assert_eq!(
            size("image/gif", b"GIF89a\x0a\x00\x05\x00\x00\x00\x00"),
            Some((10, 5))
        );
        assert_eq!(size("image/gif", b"GIF89a"), None);
        assert_eq!(
            size("image/gif", b"GIF8xa\x0a\x00\x05\x00\x00\x00\x00"),
            None
        );
        assert_eq!(
            size("image/png", b"GIF89a\x0a\x00\x05\x00\x00\x00\x00"),
            None
        );
    }

    #[test]
    fn a_jpeg_walk_stays_within_its_bytes() {
        // Segment lengths that point past the end, or loop on fill bytes to the end.
        for bad in [
            &b"\xff\xd8\xff\xe0\xff\xf0"[..],
            b"\xff\xd8\xff\xff\xff\xff",
            b"\xff\xd8\xff\xc0\x00\x40\x08",
            b"\xff\xd8\xff\xe0\x00\x00",
        ] {
            assert_eq!(size("image/jpeg", bad), None, "{bad:?}");
        }
    }
}
