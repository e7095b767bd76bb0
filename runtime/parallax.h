// The one header a trainer includes: init, the runtime, the engines (plain and pipeline),
// the optimizer spec.
#pragma once

#include "parallax/core/config.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/core/metrics.h"
#include "parallax/core/world.h"
#include "parallax/runtime/engine.h"
#include "parallax/runtime/explain.h"
#include "parallax/runtime/optimizer.h"
#include "parallax/runtime/pipeline_engine.h"
#include "parallax/runtime/runtime.h"
#include "parallax/zero/deferred_construction.h"
