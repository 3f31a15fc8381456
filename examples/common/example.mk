# Build rules shared by the CUDA examples. An example's Makefile sets NAME (the
# program), SOURCES, and optionally RUN_ARGS, then includes this file.
#
#   make                 build with plain nvcc (static cudart, SASS + PTX for ARCH)
#   make run             build and run with RUN_ARGS (override: make run RUN_ARGS="...")
#   make ARCH=sm_80      target another GPU; the embedded PTX lets newer GPUs JIT it
#   make BUILD=/tmp/out  put the program elsewhere (default: beside the sources)
#
# Nothing mneme-specific is needed: `mneme record -rdb DIR -- ./NAME` records
# the program as built here.

ARCH ?= sm_90
NVCC ?= nvcc
NVCCFLAGS ?= -O3
BUILD ?= .
COMMON_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
EXAMPLE_DIR := $(patsubst %/,%,$(dir $(firstword $(MAKEFILE_LIST))))

PROGRAM := $(BUILD)/$(NAME)

.PHONY: all run clean
all: $(PROGRAM)

# -arch=sm_XX embeds both the sm_XX SASS and the compute_XX PTX, which is what
# mneme's PTX tier recompiles; -cudart static is nvcc's default, spelled out.
$(PROGRAM): $(addprefix $(EXAMPLE_DIR)/,$(SOURCES)) $(COMMON_DIR)/example_util.h
	@mkdir -p $(BUILD)
	$(NVCC) -arch=$(ARCH) -cudart static $(NVCCFLAGS) -I$(COMMON_DIR) -o $@ $(addprefix $(EXAMPLE_DIR)/,$(SOURCES))

run: $(PROGRAM)
	$(PROGRAM) $(RUN_ARGS)

clean:
	rm -f $(PROGRAM)
