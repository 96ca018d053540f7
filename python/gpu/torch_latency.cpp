// Cost of a warm malloc / free pair through PyTorch's CUDA caching allocator
// (c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete), the
// counterpart of latency.c, which measures xseg_malloc / xseg_free: the same
// seven sizes, one warm-up round, then 200000 rounds of each loop on the
// current stream of device 0, and the same output lines with "torch" for
// "xseg". Loops:
//   single  allocate one block and free it at once, the sizes in turn
//   batch   allocate one block of each size, then free them all
// PYTORCH_CUDA_ALLOC_CONF (expandable_segments:True, backend:cudaMallocAsync)
// is read by the allocator itself when the library loads and at init; the
// value is echoed on each line. Build and run on the GPU machine, with T
// torch's package directory:
//   g++ -O2 -std=c++17 python/gpu/torch_latency.cpp -I$T/include
//     -I/usr/local/cuda/include -L$T/lib -lc10 -lc10_cuda
//     -Wl,-rpath,$T/lib -o torch_latency   (one line)
//   ./torch_latency
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

namespace cca = c10::cuda::CUDACachingAllocator;

int main() {
	const char* conf = std::getenv("PYTORCH_ALLOC_CONF");  // newer PyTorch reads it first
	if (!conf || !*conf) conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
	if (!conf || !*conf) conf = "native";
	try {
		const int devices = c10::cuda::device_count();
		if (devices < 1) {
			std::fprintf(stderr, "no CUDA device\n");
			return 1;
		}
		if (!cca::get()->initialized()) cca::init(devices);  // what torch.cuda's lazy init does
		c10::cuda::set_device(0);
		const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();

		const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 24 << 20, 100 << 20};
		constexpr int K = sizeof sizes / sizeof sizes[0];
		void* ps[K];
		for (int j = 0; j < K; j++) {  // warm the cache
			void* p = cca::raw_alloc_with_stream(sizes[j], stream);
			if (!p) {
				std::fprintf(stderr, "raw_alloc(%zu) returned null\n", sizes[j]);
				return 1;
			}
			cca::raw_delete(p);
		}
		const int N = 200000;
		long failed_single = 0, failed_batch = 0;
		using steady = std::chrono::steady_clock;
		auto per_pair = [&](steady::time_point t0) {
			return std::chrono::duration<double, std::nano>(steady::now() - t0).count() / ((double)N * K);
		};

		auto t0 = steady::now();
		for (int i = 0; i < N; i++) {
			for (int j = 0; j < K; j++) {
				void* p = cca::raw_alloc_with_stream(sizes[j], stream);
				failed_single += p == nullptr;
				cca::raw_delete(p);
			}
		}
		double single = per_pair(t0);

		t0 = steady::now();
		for (int i = 0; i < N; i++) {
			for (int j = 0; j < K; j++) ps[j] = cca::raw_alloc_with_stream(sizes[j], stream);
			for (int j = 0; j < K; j++) {
				failed_batch += ps[j] == nullptr;
				cca::raw_delete(ps[j]);
			}
		}
		double batch = per_pair(t0);

		std::printf("torch single malloc+free pair: %.1f ns (%ld failed) [%s]\n", single, failed_single, conf);
		std::printf("torch cached malloc+free pair: %.1f ns (%ld failed) [%s]\n", batch, failed_batch, conf);
		long expandable = -1;  // -1: this backend does not tell
		try {
			expandable = (long)cca::getExpandableSegmentSizes(0).size();
		} catch (const std::exception&) {
		}
		const auto st = cca::getDeviceStats(0);
		const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
		std::printf("torch stats: segments=%lld reserved_bytes=%lld peak_reserved_bytes=%lld "
		            "expandable_segments=%ld device_allocs=%lld [%s]\n",
		            (long long)st.segment[all].current, (long long)st.reserved_bytes[all].current,
		            (long long)st.reserved_bytes[all].peak, expandable,
		            (long long)st.num_device_alloc, conf);
		return failed_single + failed_batch != 0;
	} catch (const std::exception& e) {
		std::fprintf(stderr, "torch_latency: %s\n", e.what());
		return 1;
	}
}
