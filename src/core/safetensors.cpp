#include "quiver/safetensors.h"
