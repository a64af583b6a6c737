"""Credentials in shard URLs are never persisted: redact_url / redact_config, and a whole run (training as a
sweep point over shards served on 127.0.0.1 behind a signed URL, wandb offline, then eigtrain-rr) leaves the
token in no file and no file name under its directories."""

import functools
import http.server
import json
import logging
import os
import subprocess
import sys
import threading

import pytest

from eigtrain.data.sample_counts import shard_counts
from eigtrain.data.shards import ShardError
from eigtrain.redact import MASK, RedactingFilter, redact_config, redact_url, redact_yaml_file

TOKEN = "s3cr3tT0ken42"


@pytest.mark.parametrize(
    "url,expected",
    [
        (
            "https://host/in1k/train-{000000..000009}.tar?X-Amz-Signature=s3cr3tT0ken42&X-Amz-Expires=60",
            f"https://host/in1k/train-{{000000..000009}}.tar?X-Amz-Signature={MASK}&X-Amz-Expires={MASK}",
        ),
        ("https://user:s3cr3tT0ken42@host:8080/a/b.tar", f"https://{MASK}@host:8080/a/b.tar"),
        ("https://s3cr3tT0ken42@github.com/x.tar", f"https://{MASK}@github.com/x.tar"),
        ("https://u:p@ss:s3cr3tT0ken42@host/x.tar", f"https://{MASK}@host/x.tar"),  # '@' inside the password
        (
            "{https://a/x.tar?sig=s3cr3tT0ken42,https://b/y.tar?sig=s3cr3tT0ken42}",
            f"{{https://a/x.tar?sig={MASK},https://b/y.tar?sig={MASK}}}",
        ),
        (
            "pipe:curl -s -H 'Authorization: Bearer s3cr3tT0ken42' 'https://h/x.tar?token=s3cr3tT0ken42'",
            f"pipe:curl -s -H 'Authorization: {MASK}' 'https://h/x.tar?token={MASK}'",
        ),
        (
            "pipe:AWS_SECRET_ACCESS_KEY=s3cr3tT0ken42 aws s3 cp s3://b/x.tar -",
            f"pipe:AWS_SECRET_ACCESS_KEY={MASK} aws s3 cp s3://b/x.tar -",
        ),
        ("pipe:curl -s -u me:s3cr3tT0ken42 https://h/x.tar", f"pipe:curl -s -u {MASK} https://h/x.tar"),
        (
            "pipe:wget -qO- --password=s3cr3tT0ken42 https://h/x.tar",
            f"pipe:wget -qO- --password={MASK} https://h/x.tar",
        ),
        ("file:///data/x.tar?s3cr3tT0ken42", f"file:///data/x.tar?{MASK}"),
        (
            "cannot open shard https://h/x.tar?sig=s3cr3tT0ken42: HTTP 403 Forbidden",
            f"cannot open shard https://h/x.tar?sig={MASK}: HTTP 403 Forbidden",
        ),
        # nothing to hide: unchanged
        ("s3://bucket/train-{0..9}.tar", "s3://bucket/train-{0..9}.tar"),
        ("/data/shards/train-000000.tar", "/data/shards/train-000000.tar"),
        ("pipe:aws s3 cp s3://b/x.tar -", "pipe:aws s3 cp s3://b/x.tar -"),
        ("optim.lr=0.05", "optim.lr=0.05"),
    ],
)
def test_redact_url_keeps_scheme_host_and_path_and_drops_credentials(url, expected):
    assert redact_url(url) == expected
    assert TOKEN not in redact_url(url)


def test_redact_config_redacts_every_string_and_leaves_the_live_config_alone():
    from omegaconf import OmegaConf

    live = OmegaConf.create(
        {
            "data": {"shards": [f"https://h/a.tar?sig={TOKEN}", f"https://u:{TOKEN}@h/b.tar"], "root": None},
            "steps": 3,
            "name": "run",
        }
    )
    saved = redact_config(live)
    assert TOKEN not in json.dumps(saved) and saved["steps"] == 3 and saved["name"] == "run"
    assert saved["data"]["shards"] == [f"https://h/a.tar?sig={MASK}", f"https://{MASK}@h/b.tar"]
    assert TOKEN in live.data.shards[0]  # the run itself still reads the real URL


def test_shard_errors_and_log_lines_carry_no_credential(tmp_path):
    with pytest.raises(ShardError) as error:
        shard_counts([f"http://127.0.0.1:9/x.tar?sig={TOKEN}"], cache_dir=tmp_path, timeout_s=2)
    assert TOKEN not in str(error.value) and "127.0.0.1:9/x.tar" in str(error.value)
    record = logging.LogRecord(
        "eigtrain", logging.WARNING, __file__, 1, "skipping shard %s", (f"https://h/x?t={TOKEN}",), None
    )
    assert RedactingFilter().filter(record) and TOKEN not in record.getMessage()


def test_multirun_yaml_is_rewritten_without_credentials_and_keeps_interpolations(tmp_path):
    path = tmp_path / "multirun.yaml"
    path.write_text(
        f"run_dir: runs/${{name}}\nhydra:\n  overrides:\n    task:\n    - data.shards='https://h/x.tar?sig={TOKEN}'\n"
    )
    redact_yaml_file(path)
    text = path.read_text()
    assert TOKEN not in text and "${name}" in text and f"sig={MASK}" in text


# ------------------------------------------------------------------------------------- a whole run


def files_holding(root, needle: str) -> list[str]:
    """Files under root whose bytes or whose path contain needle."""
    hits = []
    for path in sorted(root.rglob("*")):
        if needle in str(path.relative_to(root)) or (path.is_file() and needle.encode() in path.read_bytes()):
            hits.append(str(path.relative_to(root)))
    return hits


@pytest.fixture
def signed_shards(tmp_path):
    """A brace pattern of signed URLs (token in the query) for class-ordered shards served on 127.0.0.1; the
    server ignores the query, as a store accepting the signature would."""
    from tests.support.foreign_shards import PATTERN, QuietHandler, write_class_ordered

    directory = write_class_ordered(tmp_path / "store")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(directory))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{PATTERN}?X-Amz-Credential=AKIA{TOKEN}&X-Amz-Signature={TOKEN}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_a_run_over_signed_urls_persists_the_token_nowhere(signed_shards, tmp_path, capsys):
    from eigtrain.export.command import main as rr_main
    from tests.support.foreign_shards import train_overrides

    sweep = tmp_path / "sweep"
    mine = ["steps=2", "checkpoint_every=1", "logging.wandb.mode=offline"]
    overrides = [
        o for o in train_overrides(sweep, signed_shards) if o.split("=")[0] not in {m.split("=")[0] for m in mine}
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    out = subprocess.run(
        [sys.executable, "-m", "eigtrain.train.command", "-m", *overrides, *mine],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (point,) = [p for p in sweep.iterdir() if p.is_dir()]
    assert (point / "wandb").is_dir() and list((point / "data").glob("shard-counts-*.json"))  # all were written
    assert f"X-Amz-Signature={MASK}" in (point / "config.yaml").read_text()  # the shards can still be told apart

    # eigtrain-rr of the run: the saved (redacted) URLs cannot be read, the command line gives them again
    assert rr_main([f"run_dir={point}", "num_workers=0"]) == 2
    assert "saved without its credentials" in capsys.readouterr().err
    assert rr_main([f"run_dir={point}", f"data.shards={signed_shards}", "num_workers=0"]) == 0
    assert (point / "rr" / "manifest.json").is_file()

    assert files_holding(sweep, TOKEN) == []  # sweep dir, run dir, checkpoints, caches, wandb, export
    assert TOKEN not in out.stdout + out.stderr


def test_a_shard_index_of_signed_urls_stores_none_and_still_serves_their_counts(tmp_path):
    from eigtrain.data.shards import expand_shards
    from eigtrain.data.write import main as shards_main
    from tests.support.foreign_shards import write_class_ordered

    store = write_class_ordered(tmp_path / "store", classes=2, per_class=3)
    pattern = f"file://{store}/cls-{{000000..000001}}.tar?sig={TOKEN}"  # the local reader ignores the query
    shards_main(["index", pattern, f"out={tmp_path / 'index.json'}"])
    assert TOKEN not in (tmp_path / "index.json").read_text()
    assert shard_counts(expand_shards(pattern), shard_index=str(tmp_path / "index.json")) == [3, 3]


@pytest.fixture
def corrupt_signed_shards(tmp_path):
    """A signed brace pattern of two shards served on 127.0.0.1 whose every image is unreadable: past
    data.max_corrupt=0 at once, an error naming the shard (URL) and the sample."""
    import webdataset as wds

    from tests.support.foreign_shards import QuietHandler  # the server's own request log would print the token

    (tmp_path / "store").mkdir()
    for shard in range(2):
        with wds.TarWriter(str(tmp_path / "store" / f"bad-{shard:06d}.tar")) as sink:
            for i in range(40):
                sink.write({"__key__": f"s{shard}-{i}", "jpg": b"not a jpeg", "cls": 0})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(tmp_path / "store"))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/bad-{{000000..000001}}.tar?X-Amz-Signature={TOKEN}"
    server.shutdown()
    server.server_close()


def test_a_one_line_error_of_eigtrain_train_carries_no_credential(corrupt_signed_shards, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "eigtrain.train.command",
            "experiment=cpu_debug",
            f"run_dir={tmp_path / 'r'}",
            f"data.shards='{corrupt_signed_shards}'",
            "data.image_size=[8,8]",
            "data.augment=cifar",
            "data.max_corrupt=0",
            "data.num_workers=0",
            "batch_size=16",
            "logging.wandb.mode=disabled",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode != 0 and "bad-00000" in out.stderr, out.stderr[-2000:]
    assert TOKEN not in out.stdout + out.stderr


def test_eigtrain_rr_errors_carry_no_credential(corrupt_signed_shards, tmp_path, capsys):
    from eigtrain.export.command import main as rr_main

    assert (
        rr_main(
            [
                "encoder=timm:resnet18",
                f"data.shards={corrupt_signed_shards}",
                "data.image_size=16",
                "num_workers=0",
                "batch_size=16",
                f"out={tmp_path / 'rr'}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "bad-00000" in err and TOKEN not in err, err


# ------------------------------------------------------------------------------- credentials in pipe: commands


@pytest.mark.parametrize(
    "command",
    [
        f"pipe:curl -s --oauth2-bearer {TOKEN} https://h/x.tar",
        f"pipe:curl -s -H 'PRIVATE-TOKEN: {TOKEN}' https://gitlab/x.tar",
        f'pipe:curl -s -H "Api-Key: {TOKEN}" https://h/x.tar',
        f"pipe:wget -qO- --header='X-Session: {TOKEN}' https://h/x.tar",
        f"pipe:gsutil -o Credentials:gs_oauth2_refresh_token={TOKEN} cat gs://b/x.tar",
        f"pipe:gsutil -o 'Credentials:gs_oauth2_refresh_token={TOKEN}' cat gs://b/x.tar",
        f"pipe:curl --anyauth -u me:{TOKEN} https://h/x.tar",
        f"pipe:curl --user=me:{TOKEN} https://h/x.tar",
        f"pipe:rclone cat --s3-secret-access-key={TOKEN} s3:b/x.tar",
        f"pipe:curl -b session_id={TOKEN} https://h/x.tar",
        f"pipe:curl --cookie 'sid={TOKEN}' https://h/x.tar",
        f"pipe:AWS_SESSION_TOKEN={TOKEN} aws s3 cp s3://b/x.tar -",
        f"pipe:mytool --api-key {TOKEN} --sig={TOKEN} get /x.tar",
        f"pipe:curl 'https://h/x.tar?access_key={TOKEN}&private=1'",
        # by shape where the name says nothing (issue 51 §5), and forms no test named before
        f"pipe:sshpass -p {TOKEN} scp me@h:/x.tar /dev/stdout",
        f"pipe:7z x -so -p{TOKEN} /d/x.tar",
        f"pipe:mysql -u me -p{TOKEN} -e 'select' /d/x.tar",
        f"pipe:unzip -P {TOKEN} -p a.zip /d/x.tar",
        f'pipe:curl -s -H "X-JFrog-Art-Api: {TOKEN}" https://h/x.tar',
        f"pipe:ghtool --pat={TOKEN} get /x.tar",
        f"pipe:tool --gh_pat {TOKEN} --db-pwd={TOKEN} get /x.tar",
        f"pipe:azcopy cp --sas={TOKEN} https://h/x.tar",
    ],
)
def test_credentials_in_a_pipe_command_are_found_by_their_name_whatever_the_tool(command):
    redacted = redact_url(command)
    assert TOKEN not in redacted and MASK in redacted, redacted
    tail = command.split()[-1 if not command.endswith("-") else -2].strip("'")  # the shard itself stays named
    assert tail.split("?")[0] in redacted, redacted


@pytest.mark.parametrize(
    "command",
    [
        "pipe:curl --anyauth https://auth-server:8080/x.tar",  # a flag: the URL after it is no value
        "pipe:aws s3 cp s3://my-keys-bucket/x.tar -",
        "pipe:cat /data/tokens/x.tar",
        "pipe:ssh -p 22 host cat /data/x.tar",  # -p with a number, a path or a file name: no password's shape
        "pipe:mkdir -p /tmp/x && cat /data/x.tar",
        "pipe:unzip -p /data/a.zip x.tar",
        "pipe:tool --path=/data/pat/x.tar --rapid=1 --api-version=2",  # pat, api: auth-like only as a name's last part
        # a reference the shell expands when the job runs: no credential is in the text, so nothing is masked
        'pipe:curl -H "Authorization: Bearer $TOKEN" https://h/x.tar',
        "pipe:curl --oauth2-bearer ${GITLAB_TOKEN} https://h/x.tar",
        "pipe:AWS_SECRET_ACCESS_KEY=$MY_SECRET aws s3 cp s3://b/x.tar -",
    ],
)
def test_a_pipe_command_without_credentials_is_unchanged(command):
    assert redact_url(command) == command


def test_a_credential_masked_once_is_masked_in_any_later_message():
    redact_url(f"pipe:curl -H 'Authorization: Bearer {TOKEN}x' -u me:{TOKEN}y https://h/x.tar")
    assert TOKEN not in redact_url(f"curl: (22) token {TOKEN}x refused: https://h/x.tar")
    assert TOKEN not in redact_url(f"curl: (67) password {TOKEN}y refused: https://h/x.tar")


@pytest.mark.slow
def test_a_pipe_command_with_credentials_leaves_them_in_no_file_of_a_run(tmp_path):
    """The command runs with its token (it checks it) and every file of the run, the count cache included, lacks it."""
    from tests.support.foreign_shards import write_class_ordered

    store = write_class_ordered(tmp_path / "store", classes=2, per_class=40)
    check = tmp_path / "fetch.sh"  # a client that serves the shard only with the right header
    check.write_text(f'[ "$2" = "Api-Key: {TOKEN}" ] && exec cat "$3"\n')
    command = f'pipe:sh {check} -H "Api-Key: {TOKEN}" {store}/cls-{{000000..000001}}.tar'
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "eigtrain.train.command",
            "experiment=cpu_debug",
            f"run_dir={run_dir}",
            f"data.shards='{command}'",
            "data.image_size=[8,8]",
            "data.augment=cifar",
            "data.label_key=cls",
            "data.num_workers=0",
            "batch_size=16",
            "steps=2",
            "checkpoint_every=1",
            "logging.wandb.mode=offline",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert list((run_dir / "data").glob("shard-counts-*.json")) and (run_dir / "wandb").is_dir()
    assert "Api-Key: REDACTED" in (run_dir / "config.yaml").read_text()
    assert files_holding(run_dir, TOKEN) == [] and TOKEN not in out.stdout + out.stderr


# ------------------------------------------------------------------------------- credentials in URLs: usable


@pytest.fixture
def basic_auth_shards(tmp_path):
    """Shards on 127.0.0.1 behind HTTP basic auth (user `me`, password TOKEN): 401 without them."""
    import base64

    from tests.support.foreign_shards import QuietHandler, write_class_ordered

    directory = write_class_ordered(tmp_path / "store", classes=2, per_class=3)
    expected = "Basic " + base64.b64encode(f"me:{TOKEN}".encode()).decode()

    class Guarded(QuietHandler):
        def do_GET(self):
            if self.headers.get("Authorization") != expected:
                self.send_error(401)
                return
            super().do_GET()

        do_HEAD = do_GET

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Guarded, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://me:{TOKEN}@127.0.0.1:{server.server_address[1]}/cls-{{000000..000001}}.tar"
    server.shutdown()
    server.server_close()


def test_a_url_with_user_and_password_is_read_with_them_and_stored_without(basic_auth_shards, tmp_path):
    from eigtrain.data.shards import expand_shards

    assert shard_counts(expand_shards(basic_auth_shards), cache_dir=tmp_path / "cache", timeout_s=5) == [3, 3]
    assert files_holding(tmp_path / "cache", TOKEN) == []
    with pytest.raises(ShardError) as error:  # the wrong password: refused, and named without it
        shard_counts([basic_auth_shards.replace(TOKEN, "wrong").replace("{000000..000001}", "000000")], timeout_s=5)
    assert "HTTP 401" in str(error.value) and "wrong" not in str(error.value)
