# Sourced by scripts/run.sh and scripts/test.sh: decides whether the C++ build
# compiles the CUDA backend, and says so on screen with how to get the other.
#   FLASHGLA_CUDA=ON    always (an error when nvcc is missing); CI asks for this,
#                       so every CUDA source compiles there although nothing runs it
#   FLASHGLA_CUDA=OFF   never (CPU backend only)
#   FLASHGLA_CUDA=AUTO  (the default) when nvcc is found and a GPU is visible
#                       (`nvidia-smi -L` succeeds): compiling the kernels takes many
#                       minutes on a small machine, and without a GPU nothing runs them
# Sets FLASHGLA_CUDA_BUILD=ON|OFF for `cmake -DFLASHGLA_CUDA=...`.

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

flashgla_gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

flashgla_choose_cuda() {
  local script=$1 asked=${FLASHGLA_CUDA:-AUTO}
  case "$asked" in
    ON | on)
      FLASHGLA_CUDA_BUILD=ON
      echo "$script: building the CPU and CUDA backends (FLASHGLA_CUDA=ON); CPU only: FLASHGLA_CUDA=OFF bash $script" ;;
    OFF | off)
      FLASHGLA_CUDA_BUILD=OFF
      echo "$script: building the CPU backend only (FLASHGLA_CUDA=OFF); with CUDA: FLASHGLA_CUDA=ON bash $script" ;;
    AUTO | auto)
      if ! flashgla_gpu_visible; then
        FLASHGLA_CUDA_BUILD=OFF
        echo "$script: building the CPU backend only: no GPU is visible (nvidia-smi -L failed)." \
             "To compile the CUDA backend anyway: FLASHGLA_CUDA=ON bash $script"
      elif ! command -v nvcc >/dev/null; then
        FLASHGLA_CUDA_BUILD=OFF
        echo "$script: building the CPU backend only: a GPU is visible but nvcc was not found" \
             "(install the CUDA toolkit or put nvcc on PATH, then run again)"
      else
        FLASHGLA_CUDA_BUILD=ON
        echo "$script: building the CPU and CUDA backends (a GPU is visible and nvcc found);" \
             "CPU only: FLASHGLA_CUDA=OFF bash $script"
      fi ;;
    *)
      echo "$script: FLASHGLA_CUDA must be ON, OFF or AUTO, got '$asked'" >&2
      return 2 ;;
  esac
}
