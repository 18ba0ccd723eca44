# The two commands of the README: `make run` (the default training job) and `make test` (every test).
# Each installs what is missing from Debian's packages first (quietly, and only when something is).
BUILD ?= build
# ON turns compiler warnings into errors (CI's Debian 12 build); a developer's build keeps them warnings.
# Unset, a configured tree keeps its setting: `make test COHORT_WERROR=ON` then `make test-swarm` must not
# rebuild every file with other flags (it did: CI's later steps each rebuilt the tree without -Werror).
COHORT_WERROR ?=
werror = $(if $(COHORT_WERROR),-DCOHORT_WERROR=$(COHORT_WERROR),)
# scripts/install-deps owns the package list, under the names of the running Debian release.

.PHONY: all deps build run test bench fuzz clean check-cuda test-pip check-debian13 deb install-check test-reference bench-pytorch test-slow test-swarm test-slurm test-mlflow test-asan test-tsan

all: build

deps:
	@bash scripts/install-deps

build: deps
	@cmake --preset default $(werror) > /dev/null
	@cmake --build --preset default

# The default job needs the cohort binary alone: the tests, benchmarks and examples are built by `make test`.
run: deps
	@cmake --preset default $(werror) > /dev/null
	@cmake --build --preset default --target cohort
	./$(BUILD)/cohort train

# The unit tests run as two processes side by side (Unit.Batch1of2 and 2of2; `ctest -L '^unit$$'` runs
# them one by one). ctest -j2 runs two tests at a time on the machine's 2 cores: the process tests say
# which must run alone or never beside each other (Note [Process tests two at a time] in
# tests/CMakeLists.txt). The fuzz smoke run (scripts/fuzz --smoke) builds its own
# clang + sanitizer tree in build-fuzz/.
test: build
	cd $(BUILD) && ctest --output-on-failure -j2 --timeout 1500 -LE '^unit$$|reference|slow|swarm|slurm|mlflow'
	bash scripts/fuzz --smoke

# The long variants (tests named Slow*, ctest label slow: the 20 kill trials, the 12000-step soak): CI
# runs them after its other checks when they leave room.
test-slow: build
	cd $(BUILD) && ctest --output-on-failure -j1 -L slow

# The swarm's longer failure runs (ctest label swarm): CI runs them after its other checks when they
# leave room.
test-swarm: build
	cd $(BUILD) && ctest --output-on-failure -j1 -L '^swarm$$'

# cohort under a real Slurm (ctest label slurm: tests/slurm/slurm_jobs.py), with Debian's Slurm and munge
# installed first; as root, else the test skips and says why. CI runs it when it fits (about 41 s).
test-slurm: build
	@bash scripts/install-deps slurmctld slurmd slurm-client munge
	cd $(BUILD) && ctest --output-on-failure -j1 -L '^slurm$$'

# The unit tests under AddressSanitizer + UndefinedBehaviorSanitizer, and the threaded parts (peer watch,
# loader, image folder, resource monitor, store, the MLflow sender; docs/developing.md says why not the Gloo
# communicator and ddp's reducer) under ThreadSanitizer: each its own gcc tree
# (build-asan/, build-tsan/). Run them before closing work on the code they cover; CI runs them when its
# measured time leaves room.
test-asan: deps
	@cmake --preset asan > /dev/null
	@cmake --build --preset asan
	ctest --preset asan
test-tsan: deps
	@cmake --preset tsan > /dev/null
	@cmake --build --preset tsan
	setarch $$(uname -m) -R ctest --preset tsan

# cohort's MLflow runs against a real `mlflow server` and MLflow's client, and the run's page in headless
# Chromium (ctest label mlflow), in the reference environment (scripts/pip-libtorch); .ci/run runs it
# when it fits.
test-mlflow: build
	@bash scripts/install-deps chromium
	@cmake --preset default -DCOHORT_REFERENCE_PYTHON=$$(bash scripts/pip-libtorch --venv)/bin/python > /dev/null
	cd $(BUILD) && ctest --output-on-failure -j1 -L '^mlflow$$'

# cohort against timm, torchvision, safetensors, TensorBoard, torch.optim and Perfetto (ctest label reference), in
# the reference environment that scripts/pip-libtorch makes or reuses (CI runs it after check-cuda).
test-reference: build
	@bash scripts/install-deps chromium
	@cmake --preset default -DCOHORT_REFERENCE_PYTHON=$$(bash scripts/pip-libtorch --venv)/bin/python > /dev/null
	cd $(BUILD) && ctest --output-on-failure -j1 -L reference

# Every LibTorch users build against (docs/platforms.md). check-cuda: every target with CUDA and NCCL
# against pip's CUDA LibTorch, linked, one CUDA runtime (CI runs it after make test). test-pip: the CPU
# tests on that build. check-debian13: make test, make deb and the package's install in a Debian 13 root.
check-cuda:
	bash scripts/check-cuda
test-pip:
	bash scripts/check-cuda --test
check-debian13:
	bash scripts/check-debian13

# A Debian package of the install (cmake/Install.cmake), in $(BUILD)/: apt-get install ./build/cohort_*.deb
deb: build
	cd $(BUILD) && cpack -G DEB > /dev/null && ls cohort_*.deb

# cohort against PyTorch 2.14 in one run (bench/vs_pytorch.py): the peers in the reference environment, cohort
# built against the same LibTorch (check-cuda's build, which runs on the CPU) and the Debian build beside it.
bench-pytorch: build
	bash scripts/check-cuda
	/usr/bin/python3 bench/vs_pytorch.py --python $$(bash scripts/pip-libtorch --venv)/bin/python \
	  --cohort build-cuda/cohort --cohort ./$(BUILD)/cohort --pipeline ./$(BUILD)/bench/input_pipeline --full \
	  --out bench/results/vs_pytorch.json

# The rest compare with Debian's python3-torch 1.13, the LibTorch of ./$(BUILD): kept as history.
bench: build bench-pytorch
	/usr/bin/python3 bench/default_job.py --cohort ./$(BUILD)/cohort --out bench/results/default_job.json
	/usr/bin/python3 bench/auto_configs.py --cohort ./$(BUILD)/cohort --out bench/results/auto_configs.json
	/usr/bin/python3 bench/configs_mfu.py --cohort ./$(BUILD)/cohort --out bench/results/configs_mfu.json
	/usr/bin/python3 bench/ddp_scaling.py --cohort ./$(BUILD)/cohort --out bench/results/ddp_scaling.json
	./$(BUILD)/bench/compress_bytes > bench/results/compress_bytes.json
	/usr/bin/python3 bench/slow_network.py --cohort ./$(BUILD)/cohort --out bench/results/slow_network.json
	/usr/bin/python3 bench/input_pipeline.py --bench ./$(BUILD)/bench/input_pipeline --out bench/results/input_pipeline.json
	/usr/bin/python3 bench/resnet50_cpu.py --cohort ./$(BUILD)/cohort --out bench/results/resnet50_cpu.json
	./$(BUILD)/bench/sharded_memory > bench/results/sharded_memory.json
	/usr/bin/python3 bench/sharded_step.py --cohort ./$(BUILD)/cohort --out bench/results/sharded_step.json
	/usr/bin/python3 bench/compress_accuracy.py --cohort ./$(BUILD)/cohort --out bench/results/compress_accuracy.json
	./$(BUILD)/bench/store_latency > bench/results/store_latency.json
	/usr/bin/python3 bench/gpu_compare.py --device cpu --cohort-bench ./$(BUILD)/bench/gpu_train_step \
	  --python /usr/bin/python3 --rounds 3 --r50-model resnet18 --r50-batch 32 --r50-image 64 --r50-classes 10 \
	  --r50-steps 6 --r50-warmup 2 --precisions fp32,bf16 --ab-batch 256 --ab-dataset-size 2048 --ab-epochs 1 \
	  --ab-precision bf16 --ab-warmup 2 --out-dir bench/out/cpu-precision
	cp bench/out/cpu-precision/gpu_resnet50.json bench/results/cpu_precision_resnet18.json
	cp bench/out/cpu-precision/gpu_airbench.json bench/results/cpu_precision_airbench.json

# Every parser of outside input under libFuzzer, ASan and UBSan, FUZZ_SECONDS (60) each: bench/results/fuzz.json.
fuzz: deps
	bash scripts/fuzz

clean:
	rm -rf $(BUILD)
