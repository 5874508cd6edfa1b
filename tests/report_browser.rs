//! `tessel report` pages in a real headless Chromium: the page loads without console messages,
//! and a 1400×1000 screenshot shows the timeline's forward and backward boxes above the memory
//! chart's bars, for a dense (Llama 3 70B) and a mixture-of-experts (Mixtral 8x7B) plan.
//! Skips with a message when no Chromium is installed (`apt-get install chromium`; CI does).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tessel_planner::report::palette;

/// The first Chromium on PATH, or `$TESSEL_CHROMIUM`.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TESSEL_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Runs Chromium headless, isolated (no network services, a fresh profile), with `extra`.
fn headless(browser: &Path, profile: &Path, extra: &[String]) -> Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .output()
        .expect("run chromium")
}

fn tessel(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run tessel");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn rgb(hex: &str) -> [u8; 3] {
    let byte = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap();
    [byte(1), byte(3), byte(5)]
}

/// Pixels of one colour in a decoded screenshot: count and bounding box.
struct Found {
    count: usize,
    min_x: usize,
    max_x: usize,
    min_y: usize,
    max_y: usize,
}

fn find_colour(pixels: &[u8], width: usize, channels: usize, hex: &str) -> Found {
    let want = rgb(hex);
    let mut found = Found {
        count: 0,
        min_x: usize::MAX,
        max_x: 0,
        min_y: usize::MAX,
        max_y: 0,
    };
    for (i, px) in pixels.chunks(channels).enumerate() {
        let close = (0..3).all(|c| px[c].abs_diff(want[c]) <= 3);
        if close {
            let (x, y) = (i % width, i / width);
            found.count += 1;
            found.min_x = found.min_x.min(x);
            found.max_x = found.max_x.max(x);
            found.min_y = found.min_y.min(y);
            found.max_y = found.max_y.max(y);
        }
    }
    found
}

fn check_plan(browser: &Path, dir: &Path, name: &str, spec: &str) {
    let plan = dir.join(format!("{name}.json"));
    let html = dir.join(format!("{name}.html"));
    tessel(&["plan", spec, "-o", plan.to_str().unwrap()]);
    tessel(&[
        "report",
        plan.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    let url = format!("file://{}", html.display());

    let dom = headless(
        browser,
        &dir.join(format!("{name}-dom-profile")),
        &["--dump-dom".to_string(), url.clone()],
    );
    assert!(
        dom.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let stdout = String::from_utf8_lossy(&dom.stdout);
    for id in [
        "predicted-timeline",
        "memory-chart",
        "time-chart",
        "runners-up",
    ] {
        assert!(
            stdout.contains(&format!("id=\"{id}\"")),
            "{name}: no #{id} in the DOM"
        );
    }
    let stderr = String::from_utf8_lossy(&dom.stderr);
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains("CONSOLE")).collect();
    assert!(console.is_empty(), "{name}: console messages: {console:?}");

    let png_path = dir.join(format!("{name}.png"));
    let shot = headless(
        browser,
        &dir.join(format!("{name}-shot-profile")),
        &[
            format!("--screenshot={}", png_path.display()),
            "--window-size=1400,1000".to_string(),
            url,
        ],
    );
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let decoder = png::Decoder::new(std::fs::File::open(&png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((info.width, info.height), (1400, 1000));
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let width = info.width as usize;
    let pixels = &pixels[..info.buffer_size()];
    let find = |hex: &str| find_colour(pixels, width, channels, hex);

    let forward = find(palette::FORWARD);
    let backward = find(palette::BACKWARD);
    let weights = find(palette::WEIGHTS);
    let activations = find(palette::ACTIVATIONS);
    let buffers = find(palette::BUFFERS);
    for (what, found) in [
        ("forward", &forward),
        ("backward", &backward),
        ("weights", &weights),
        ("activations", &activations),
        ("buffers", &buffers),
    ] {
        assert!(
            found.count > 500,
            "{name}: {what} colour has {} pixels",
            found.count
        );
    }
    // The timeline runs across most of the page, above the memory chart; the memory bars sit
    // in the left column.
    assert!(
        backward.max_x - forward.min_x.min(backward.min_x) > 900,
        "{name}: timeline too narrow"
    );
    assert!(forward.min_y < weights.min_y && backward.min_y < weights.min_y);
    assert!(
        weights.max_x < 700 && activations.max_x < 700,
        "{name}: memory bars not in the left column"
    );
    assert!(weights.min_y > 250 && weights.max_y < 1000);
}

#[test]
fn pages_render_in_headless_chromium() {
    let Some(browser) = chromium() else {
        eprintln!(
            "skipping the browser test: no chromium on PATH (apt-get install -y chromium, or set \
             TESSEL_CHROMIUM)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    check_plan(&browser, dir.path(), "dense", "specs/llama3-70b.tsl");
    check_plan(&browser, dir.path(), "moe", "specs/mixtral-8x7b.tsl");
}
