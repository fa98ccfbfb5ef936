# The study's interface. Words after a recipe are forwarded as they are: `just sweep depth=6`.
set positional-arguments

py := if path_exists(".venv/bin/python") == "true" { ".venv/bin/python" } else { "python3" }

# list the recipes
default:
    @just --list

# create .venv and install the project (and, on Linux, OpenBLAS and Chromium)
setup:
    ./setup.sh

# the test suite
test *args:
    {{py}} -m pytest "$@"

# tokenise a corpus: just prepare synthetic|tinystories|fineweb-edu|PATH [tokenizer=gpt2|bytes] ...
prepare *args:
    {{py}} -m mlx_gpt prepare "$@"

# train one run: just train lr=3e-3 qk_norm=rmsnorm depth=6 ...
train *args:
    {{py}} -m mlx_gpt train "$@"

# throughput, FLOP/s, share of sgemm peak, MLX vs PyTorch, probe/eval overhead, K runs at once
bench *args:
    {{py}} -m mlx_gpt bench "$@"

# tables, charts, verdicts and report.html: just report [RUNS_DIR] [--out DIR] ...
report *args:
    {{py}} -m analysis report "$@"
